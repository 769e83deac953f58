"""npm icon sets as datasets (``--data icons:DIR``): miniatures of the Tabler and Lucide layouts, the cleaning rule
(keywords normalised, synonyms merged by overlap, rare labels dropped, identical rasters merged), grouped splits, the
cache, and the errors a user meets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.data.registry import load_dataset, spec_dataset_name
from models.data.types import DataError
from models.sources.icon_sets import icon_group, merge_synonyms, normalise_keyword

pytest.importorskip("cairosvg")

SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="24" height="24" viewBox="0 0 24 24" fill="none" '
       'stroke="currentColor" stroke-width="2">{}</svg>')


def shape(i: int) -> str:
    """A distinct drawing per ``i``: a circle and a line whose places depend on it."""
    x, y = 4 + i % 16, 4 + (i * 7) % 16
    return f'<circle cx="{x}" cy="{y}" r="{2 + i % 3}"/><path d="M2 {2 + i % 20}L22 {22 - (i * 3) % 20}"/>'


def tabler(root: Path, icons: dict[str, list[str]], duplicate: tuple[str, str] | None = None) -> Path:
    """A Tabler-layout package: ``icons.json`` and ``icons/outline/<name>.svg`` (``duplicate``: a second name whose
    SVG is the first's)."""
    folder = root / "package"
    (folder / "icons" / "outline").mkdir(parents=True)
    bodies = {name: shape(i) for i, name in enumerate(icons)}
    if duplicate:
        bodies[duplicate[0]] = bodies[duplicate[1]]
    catalogue = {}
    for name, tags in icons.items():
        catalogue[name] = {"name": name, "category": "x", "tags": tags, "styles": {"outline": {"version": "1"}}}
        (folder / "icons" / "outline" / f"{name}.svg").write_text(SVG.format(bodies[name]))
    catalogue["filled-only"] = {"name": "filled-only", "tags": ["cat"], "styles": {"filled": {}}}
    (folder / "icons.json").write_text(json.dumps(catalogue))
    return root


def test_rule_pieces() -> None:
    assert normalise_keyword("  Speech_Bubble  ") == "speech-bubble" and normalise_keyword("Ｃａｔ") == "cat"
    assert icon_group("a-b-2-off") == "a-b" and icon_group("arrow-up") == "arrow-up" and icon_group("off") == "off"
    keywords = {f"i{n}": {"disabled", "off"} if n < 9 else {"disabled"} for n in range(10)}
    keywords["j"] = {"rare"}
    into = merge_synonyms(keywords, 1)
    assert into == {"disabled": "disabled", "off": "disabled", "rare": "rare"}  # 9/10 overlap: one label


def test_tabler_layout_loads_with_the_rule(tmp_path: Path) -> None:
    icons = {f"cat-{n}": ["Cat", "animal"] for n in range(6)}
    icons.update({f"dog-{n}": ["dog", "animal", *(["pet"] if n < 5 else [])] for n in range(6)})
    icons.update({f"dog-{n}-off": ["dog", "off", "disabled"] for n in range(4)})
    icons.update({"lonely": ["unique"], "copy-of-cat": ["cat", "kitten"]})
    root = tabler(tmp_path, icons, duplicate=("copy-of-cat", "cat-0"))
    spec = f"icons:{root}?min-count=4"
    assert spec_dataset_name(spec) == "icons-tabler"
    splits = load_dataset(spec)
    assert splits.name == "icons-tabler" and splits.source.endswith("?min-count=4")
    assert splits.classes == ["animal", "cat", "disabled", "dog", "pet"]  # off merged into disabled; rare dropped
    parts = [p for p in (splits.train, splits.val, splits.test) if p is not None]
    names = [Path(p).name for part in parts for p in part.paths]
    assert len(names) == 16 and not any(n.startswith("lonely") for n in names)  # 17 listed: one duplicate raster
    labels = {Path(p).name.rsplit("-", 1)[0]: row for part in parts for p, row in zip(part.paths, part.labels,
                                                                                      strict=True)}
    cat = labels["cat-0"]  # the duplicate's labels joined it
    assert cat.tolist() == [1, 1, 0, 0, 0]
    # variants of one icon (dog-1, dog-1-off) never straddle two splits
    split_of = {Path(p).name.rsplit("-", 1)[0]: name for name, part in
                (("train", splits.train), ("val", splits.val), ("test", splits.test)) if part is not None
                for p in part.paths}
    assert all(split_of[f"dog-{n}-off"] == split_of[f"dog-{n}"] for n in range(4))
    # the second load reads the cache (same files), and the protocol draws one positive per training image
    again = load_dataset(spec)
    assert [str(p) for p in again.train.paths] == [str(p) for p in splits.train.paths]
    assert np.array_equal(again.train.labels, splits.train.labels)


def test_lucide_layout_and_errors(tmp_path: Path) -> None:
    folder = tmp_path / "lucide" / "package"
    (folder / "icons").mkdir(parents=True)
    tags = {f"note-{n}": ["music", "sound"] if n % 2 else ["music"] for n in range(8)}
    for i, name in enumerate(tags):
        (folder / "icons" / f"{name}.svg").write_text(SVG.format(shape(i)))
    (folder / "tags.json").write_text(json.dumps(tags))
    splits = load_dataset(f"icons:{tmp_path / 'lucide'}?min-count=3")
    assert splits.name == "icons-lucide" and splits.classes == ["music", "sound"]
    with pytest.raises(DataError, match=r"no icon catalogue here.*npm pack @tabler/icons"):
        load_dataset(f"icons:{tmp_path}")
    with pytest.raises(DataError, match="give the unpacked npm package"):
        load_dataset("icons:")
    with pytest.raises(DataError, match="min-count must be a positive integer"):
        load_dataset(f"icons:{tmp_path / 'lucide'}?min-count=0")
    (folder / "tags.json").write_text("{not json")
    with pytest.raises(DataError, match="not a readable lucide-static catalogue"):
        load_dataset(f"icons:{tmp_path / 'lucide'}?min-count=2")


def test_phosphor_layout_reads_its_javascript_catalogue(tmp_path: Path) -> None:
    """@phosphor-icons/core lists its icons in ``dist/index.mjs``: names and tags are read from it (the ``*new*``
    markers are not keywords; ``pascal_name`` is not a name); an icon without an SVG is left out, not fatal."""
    folder = tmp_path / "phosphor" / "package"
    (folder / "assets" / "regular").mkdir(parents=True)
    (folder / "dist").mkdir()
    entries = []
    for i in range(8):
        name = f"bell-{i}"
        tags = ["*new*", "alarm", "ring"] if i % 2 else ["alarm"]
        entries.append(f'  {{\n    name: "{name}",\n    pascal_name: "Bell{i}",\n    categories: [e.OBJECTS],\n'
                       f'    tags: [\n      {", ".join(json.dumps(t) for t in tags)}\n    ],\n    codepoint: {i}\n  }}')
        if i < 7:
            (folder / "assets" / "regular" / f"{name}.svg").write_text(SVG.format(shape(i)))
    (folder / "dist" / "index.mjs").write_text("var t = 1;\nconst n = [\n" + ",\n".join(entries) + "\n];\n")
    splits = load_dataset(f"icons:{tmp_path / 'phosphor'}?min-count=3")
    assert splits.name == "icons-phosphor" and splits.classes == ["alarm", "ring"]
    assert sum(len(part.paths) for part in (splits.train, splits.val, splits.test) if part is not None) == 7
    (folder / "dist" / "index.mjs").write_text("export {};\n")
    with pytest.raises(DataError, match="not a readable @phosphor-icons/core catalogue"):
        load_dataset(f"icons:{tmp_path / 'phosphor'}?min-count=2")
