"""The ``openclipart`` dataset kind on a miniature of the Debian package's layout written by the test (no
package needed): keyword parsing and the cleaning rule, merged copies, symlinks and identical rasters, the crop,
the PNG fallback, splits, the cache (reuse, resume, rebuild on a rule change), the folder view and its export as
a ``folder:`` tree, and the errors (no package, no cairosvg)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.data.csv_format import load_csv
from models.data.folder import load_folder
from models.data.registry import describe_kinds, load_dataset, spec_dataset_name
from models.data.types import DataError, DatasetSplits
from models.sources import openclipart as oc

MIN = 2  # the miniature's minimum class count

HEAD = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:dc="http://purl.org/dc/elements/1.1/" '
        'xmlns:cc="http://web.resource.org/cc/" xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" '
        'width="{w}" height="{h}">')


def svg(path: Path, keywords: list[str] | str, body: str, size: tuple[int, int] | None = (100, 100),
        author: str = "Test Author") -> Path:
    """Write an SVG with ``keywords`` as ``<rdf:li>`` items (a string: a plain-text ``<dc:subject>``); ``size``
    None: no width and height (the page is the loader's default page)."""
    subject = (keywords if isinstance(keywords, str)
               else "<rdf:Bag>" + "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords) + "</rdf:Bag>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        (HEAD.format(w=size[0], h=size[1]) if size else HEAD.split(" width=")[0] + ">")
        + f'<metadata><rdf:RDF><cc:Work rdf:about=""><dc:title>{path.stem}</dc:title><dc:subject>{subject}'
        f"</dc:subject><dc:creator><cc:Agent><dc:title>{author}</dc:title></cc:Agent></dc:creator></cc:Work>"
        f"</rdf:RDF></metadata>{body}</svg>\n", encoding="utf-8")
    return path


def shape(colour: str, x: int = 10, y: int = 10, w: int = 80, h: int = 80) -> str:
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{colour}"/>'


def bomb_png(path: Path, side: int = 20000) -> None:
    """A PNG whose header claims ``side`` x ``side`` pixels (no pixel data): over PIL's decompression-bomb limit."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                     + chunk(b"IEND", b""))


def make_library(root: Path) -> Path:
    """A miniature ``openclipart-svg`` (``root/svg``) with a ``png`` folder beside it. Returns ``root/svg``."""
    s = root / "svg"
    dog1 = svg(s / "animals/mammals/dogs/dog1.svg", ["dog", "mammal", "animal", ""], shape("#a33"))
    svg(s / "animals/mammals/dogs/dog2.svg", ["Dogs", "Animals"], shape("#3a3"))  # plurals merge
    svg(s / "animals/birds/bird1.svg", ["bird", "animal", "HASH(0x8a07724)"], shape("#33a"))  # artifact
    svg(s / "animals/birds/bird2.svg", "bird, animal", shape("#aa3"))  # plain-text subject
    # a small drawing far from the centre of a large page, tagged with an author's name too
    svg(s / "animals/small.svg", ["animal", "Architetto Francesco Rollandin"],
        '<rect x="800" y="100" width="40" height="40" fill="#000"/>', size=(1000, 1000))
    apple = svg(s / "food/fruit/apple.svg", ["fruit", "food"], shape("#f00", 20, 20, 60, 60))
    shutil.copyfile(apple, s / "food/apple_copy.svg")  # a copy: the same drawing
    (s / "food/dog_link.svg").symlink_to(os.path.relpath(dog1, s / "food"))  # a symlink: the same drawing
    svg(s / "food/pear_a.svg", ["fruit", "food"], shape("#0f0", 30, 10, 40, 80))  # same picture as pear_b
    svg(s / "food/pear_b.svg", ["fruit", "pear"], shape("#0f0", 30, 10, 40, 80), author="Someone Else")
    svg(s / "transportation/car.svg", ["transportation", "vehicle"], shape("#0ff"))  # synonym
    svg(s / "transportation/bus.svg", ["transport", "vehicle"], shape("#f0f"), size=None)  # no page size
    svg(s / "transportation/boat.svg", ["transport", "boat"], "", size=(0, 0))  # cairosvg fails: PNG render
    Image.new("RGB", (60, 30), (0, 0, 200)).save(_png(root, "transportation/boat.png"))
    svg(s / "transportation/nopng.svg", ["vehicle"], "", size=(0, 0))  # fails, no PNG render
    svg(s / "transportation/huge.svg", ["vehicle"], "", size=(0, 0))  # fails, PNG render too large
    bomb_png(root / "png/transportation/huge.png")
    svg(s / "animals/ghost.svg", ["animal"], shape("#fff"))  # white on white: blank, its PNG render is not used
    Image.new("RGB", (20, 20), (200, 0, 0)).save(_png(root, "animals/ghost.png"))
    svg(s / "unsorted/tram.svg", ["transport", "vehicle", "unsorted"], shape("#888"))  # no class folder
    svg(s / "unsorted/nothing.svg", ["unsorted", "11"], shape("#999"))  # no keyword after cleaning
    svg(s / "people/man.svg", ["man"], shape("#123"))  # a keyword below the minimum count
    svg(s / "shapes/stars/star1.svg", ["stars", "shapes", "magick", "geometry"], shape("#ff0"))  # batch
    svg(s / "shapes/stars/star2.svg", ["stars", "shapes", "magick", "geometry"], shape("#fe0"))
    svg(s / "special/gradients/g1.svg", ["gradients", "special", "fill"], shape("#eee"))  # dropped folder
    (s / "unsorted/broken.svg").write_text("<svg><metadata><dc:subject>dog</svg", encoding="utf-8")
    return s


def _png(root: Path, rel: str) -> Path:
    path = root / "png" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture()
def library(tmp_path: Path) -> Path:
    return make_library(tmp_path / "lib")


def build(svg_root: Path, cache: Path, **kwargs: object) -> tuple[Path, dict]:
    return oc.ensure_openclipart(svg_root, min_count=MIN, cache_dir=cache, progress=False, **kwargs)  # type: ignore[arg-type]


def by_first_source(manifest: dict) -> dict[str, dict]:
    return {image["sources"][0]: image for image in manifest["images"]}


def rows_by_name(splits: DatasetSplits) -> dict[str, tuple[str, set[str]]]:
    """``{raster stem prefix: (split, label names)}`` over every split."""
    found = {}
    for split in ("train", "val", "test"):
        part = getattr(splits, split)
        for path, row in zip(part.paths if part else [], part.labels if part else [], strict=True):
            found[path.name.rsplit("-", 1)[0]] = (split, {splits.classes[j] for j in np.flatnonzero(row)})
    return found


# ---------------------------------------------------------------------------------------------- keywords (no cairo)


def test_keyword_normalisation_and_rule() -> None:
    assert oc.normalise_keyword(" Mime-Types; Christmas  Tree,") == ["mime_types", "christmas_tree", ""]
    assert oc.normalise_keyword("signs_and_symbols/weather") == ["signs_and_symbols_weather"]
    assert oc.canonical_keyword("icons") == "icon" and oc.canonical_keyword("transportation") == "transport"
    assert oc.canonical_keyword("mime_types") == "mimetypes" and oc.canonical_keyword("dog") == "dog"
    for dropped in ("", "hash", "hash(0x8a07724)", "11", "architetto_francesco_rollandin", "unsorted",
                    "united_nations_member"):
        assert oc.canonical_keyword(dropped) is None, dropped
    assert oc.canonical_keywords(["Icons", "icon", "HASH(0x1)", "Transportation"]) == ["icon", "transport"]
    # every merge target is a keyword the rule keeps, and no merge source is itself a target's source
    for target in oc.MERGED_KEYWORDS.values():
        assert oc.canonical_keyword(target) == target


def test_read_svg_metadata_both_spellings_and_broken_xml(tmp_path: Path) -> None:
    bag = svg(tmp_path / "a.svg", ["Dog", "two words"], shape("#000"), author="Ann Author")
    text = svg(tmp_path / "b.svg", "cat; bird", shape("#000"))
    assert oc.read_svg_metadata(bag) == oc.SvgMetadata(["Dog", "two words"], "Ann Author")
    assert oc.canonical_keywords(oc.read_svg_metadata(text).keywords) == ["bird", "cat"]
    (tmp_path / "c.svg").write_text("<svg><metadata></svg", encoding="utf-8")
    with pytest.raises(oc.ET.ParseError):
        oc.read_svg_metadata(tmp_path / "c.svg")


def test_folder_class_deepest_matching_folder_first_sorted_path() -> None:
    labels = {"dog", "mammal", "animal", "food"}
    assert oc.folder_class(["animals/mammals/dogs/x.svg"], labels) == "dog"
    assert oc.folder_class(["animals/mammals/big_cats/x.svg"], labels) == "mammal"  # big_cats is no class
    assert oc.folder_class(["zoo/x.svg", "food/x.svg"], labels) == "food"  # the first sorted path that matches
    assert oc.folder_class(["signs_and_symbols/x.svg"], {"sign"}) is None  # a dropped folder name


def test_missing_package_names_debian_package_and_dir_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oc, "DEFAULT_ROOT", tmp_path / "absent" / "svg")
    for spec in ("openclipart", f"openclipart:{tmp_path / 'nowhere'}", "openclipart:?view=folders"):
        with pytest.raises(DataError) as info:
            load_dataset(spec)
        assert "apt-get install openclipart-svg" in str(info.value) and "openclipart:DIR" in str(info.value)
    with pytest.raises(DataError, match="unknown option 'colour'"):
        load_dataset(f"openclipart:{tmp_path}?colour=red")
    with pytest.raises(DataError, match="unknown view"):
        load_dataset(f"openclipart:{tmp_path}?view=tags")


def test_missing_cairosvg_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cairosvg", None)  # import cairosvg -> ImportError
    with pytest.raises(DataError) as info:
        oc._cairosvg_svg2png()
    assert "pip install cairosvg" in str(info.value) and "libcairo2" in str(info.value)


def test_registry_names_and_help() -> None:
    assert spec_dataset_name("openclipart") == "openclipart"
    assert spec_dataset_name("openclipart:/x/svg") == "openclipart"
    assert spec_dataset_name("openclipart:/x/svg?view=folders") == "openclipart-folders"
    assert "openclipart[:<svg dir>]" in describe_kinds()


# ---------------------------------------------------------------------------------------------- building (cairosvg)


def test_build_cleaning_merges_crop_fallback_and_splits(library: Path, tmp_path: Path) -> None:
    pytest.importorskip("cairosvg", reason="rendering the miniature needs cairosvg (pip install cairosvg)")
    folder, manifest = build(library, tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" / "openclipart" and folder.name == manifest["digest"]
    images = by_first_source(manifest)
    # one image per distinct picture; copies, symlinks and identical rasters merged; sorted by first path
    assert list(images) == sorted([
        "animals/birds/bird1.svg", "animals/birds/bird2.svg", "animals/mammals/dogs/dog1.svg",
        "animals/mammals/dogs/dog2.svg", "animals/small.svg", "food/apple_copy.svg", "food/pear_a.svg",
        "transportation/boat.svg", "transportation/bus.svg", "transportation/car.svg", "unsorted/tram.svg"])
    assert images["animals/mammals/dogs/dog1.svg"]["sources"] == ["animals/mammals/dogs/dog1.svg",
                                                                  "food/dog_link.svg"]
    assert images["food/apple_copy.svg"]["sources"] == ["food/apple_copy.svg", "food/fruit/apple.svg"]
    pear = images["food/pear_a.svg"]
    assert pear["sources"] == ["food/pear_a.svg", "food/pear_b.svg"] and pear["author"] == "Test Author"
    assert pear["keywords"] == ["food", "fruit", "pear"] and pear["labels"] == ["food", "fruit"]  # pear: rare
    # classes: keywords on >= MIN images, merged plurals and synonyms; rare, dropped and author keywords gone
    assert manifest["classes"] == ["animal", "bird", "dog", "food", "fruit", "transport", "vehicle"]
    assert images["animals/mammals/dogs/dog2.svg"]["labels"] == ["animal", "dog"]
    assert images["animals/mammals/dogs/dog1.svg"]["keywords"] == ["animal", "dog", "mammal"]
    assert images["animals/small.svg"]["keywords"] == ["animal"]
    assert images["transportation/car.svg"]["labels"] == ["transport", "vehicle"]
    assert images["transportation/boat.svg"]["raster"] == "png"
    reasons = {}
    for entry in manifest["left_out"]:
        reasons.setdefault(entry["reason"], []).append(entry["sources"][0])
    assert reasons == {
        "unreadable": ["unsorted/broken.svg"], "dropped folder": ["special/gradients/g1.svg"],
        "batch drawing": ["shapes/stars/star1.svg", "shapes/stars/star2.svg"],
        "no keyword": ["unsorted/nothing.svg"],
        "not rasterised": ["animals/ghost.svg", "transportation/huge.svg", "transportation/nopng.svg"],
        "merged duplicate": ["food/pear_b.svg"], "no frequent keyword": ["people/man.svg"],
    }
    details = {e["sources"][0]: e["detail"] for e in manifest["left_out"]}
    assert "DecompressionBomb" in details["transportation/huge.svg"]
    assert "no png render" in details["transportation/nopng.svg"]
    assert "nothing visible" in details["animals/ghost.svg"] and "png" not in details["animals/ghost.svg"]
    counts = manifest["counts"]
    assert (counts["svg_paths"], counts["symlinks"], counts["drawings"], counts["images"]) == (23, 1, 21, 11)

    # rasters: longest side RASTER_SIZE; the small drawing is cropped to its box plus the margin, sharply
    for image in manifest["images"]:
        with Image.open(folder / image["file"]) as raster:
            assert max(raster.size) == oc.RASTER_SIZE and raster.mode == "RGB"
    with Image.open(folder / images["animals/small.svg"]["file"]) as raster:
        small = raster.convert("RGB")
    assert small.size == (256, 256)
    left, top, right, bottom = oc.content_box(small)
    pad = 256 * oc.CROP_MARGIN / (1 + 2 * oc.CROP_MARGIN)
    for edge in (left, top, 256 - right, 256 - bottom):
        assert abs(edge - pad) <= 2, (left, top, right, bottom)
    centre = np.asarray(small)[40:216, 40:216]
    assert centre.max() < 10  # the black square fills the raster, rendered at full resolution
    with Image.open(folder / images["transportation/boat.svg"]["file"]) as raster:  # from the 60x30 PNG render
        assert raster.size == (256, 140) and raster.getpixel((128, 70)) == (0, 0, 200)

    # splits: 60/20/20 by hash rank
    splits = [image["split"] for image in manifest["images"]]
    assert (splits.count("train"), splits.count("val"), splits.count("test")) == (7, 2, 2)


def test_loader_views_determinism_and_cache(library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cairosvg", reason="rendering the miniature needs cairosvg (pip install cairosvg)")
    monkeypatch.setenv("SPML_CACHE", str(tmp_path / "cache"))
    splits = load_dataset(f"openclipart:{library.parent}?min-count={MIN}")  # the folder holding svg/ and png/
    assert splits.name == "openclipart" and splits.source == f"openclipart:{library}?min-count={MIN}"
    assert spec_dataset_name(splits.source) == "openclipart"
    assert [len(splits.train), len(splits.val), len(splits.test)] == [7, 2, 2]
    rows = rows_by_name(splits)
    assert rows["dog1"][1] == {"animal", "dog"} and rows["apple_copy"][1] == {"food", "fruit"}
    assert rows["tram"][1] == {"transport", "vehicle"} and rows["small"][1] == {"animal"}
    assert any("11 images" in note for note in splits.notes)
    folder = next(p for p in (tmp_path / "cache" / "openclipart").iterdir() if p.is_dir())
    first = json.loads((folder / "manifest.json").read_text())

    # a later load reads the manifest only: no SVG parsed, nothing rendered
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache should have been used")

    with monkeypatch.context() as patch:
        patch.setattr(oc, "read_svg_metadata", fail)
        patch.setattr(oc, "rasterise_drawing", fail)
        patch.setattr(oc, "_cairosvg_svg2png", fail)
        again = load_dataset(splits.source)
    assert again.train.paths == splits.train.paths and np.array_equal(again.test.labels, splits.test.labels)

    # the same source built into another cache gives the same manifest (timings aside)
    other_folder, _ = build(library, tmp_path / "other-cache")
    other = json.loads((other_folder / "manifest.json").read_text())
    for manifest in (first, other):
        manifest["counts"].pop("render_seconds")
    assert other == first

    # the folder view: one positive per train/val image, its category folder's class; test keeps full labels
    view = load_dataset(f"openclipart:{library}?view=folders&min-count={MIN}")
    assert view.name == "openclipart-folders" and spec_dataset_name(view.source) == "openclipart-folders"
    images = {image["file"].split("/")[-1]: image for image in first["images"]}
    expected_folder = {"dog1": "dog", "dog2": "dog", "bird1": "bird", "bird2": "bird", "small": "animal",
                       "apple_copy": "food", "pear_a": "food", "car": "transport", "bus": "transport",
                       "boat": "transport", "tram": None}
    assert {name.rsplit("-", 1)[0]: image["folder_class"] for name, image in images.items()} == expected_folder
    assert view.classes == sorted({image["folder_class"] for image in first["images"]
                                   if image["split"] == "train" and image["folder_class"]})
    for part in (view.train, view.val):
        assert (part.labels.sum(1) == 1).all()
        for path, row in zip(part.paths, part.labels, strict=True):
            assert view.classes[int(np.flatnonzero(row)[0])] == images[path.name]["folder_class"]
    kept = {p.name for p in [*view.train.paths, *view.val.paths]}
    assert kept == {name for name, image in images.items() if image["split"] != "test"
                    and image["folder_class"] in view.classes}
    for path, row in zip(view.test.paths, view.test.labels, strict=True):
        assert {view.classes[j] for j in np.flatnonzero(row)} == set(images[path.name]["labels"]) & set(view.classes)


def test_interrupted_build_resumes_and_rule_change_rebuilds(library: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cairosvg", reason="rendering the miniature needs cairosvg (pip install cairosvg)")
    real = oc.rasterise_drawing
    calls: list[Path] = []

    def counting(svg_path: Path, *args: object, **kwargs: object) -> object:
        calls.append(svg_path)
        if len(calls) == 4 and interrupt:
            raise KeyboardInterrupt
        return real(svg_path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(oc, "rasterise_drawing", counting)
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        build(library, tmp_path / "cache")
    assert len(calls) == 4
    interrupt = False
    folder, manifest = build(library, tmp_path / "cache")
    candidates = 16  # drawings that reach rendering (not unreadable, dropped, batch, without keyword)
    assert len(calls) == 4 + candidates - 3  # the 3 written before the interruption are reused
    assert not list(folder.glob("images/.*"))  # no temporary file left behind

    # a changed rule is another digest: rebuilt from scratch, in its own folder
    calls.clear()
    monkeypatch.setitem(oc.DROPPED_KEYWORDS, "vehicle", "test: dropped")
    new_folder, new_manifest = build(library, tmp_path / "cache")
    assert new_folder != folder and new_manifest["digest"] != manifest["digest"]
    assert len(calls) == candidates - 2  # nopng and huge lost their only keyword
    assert "vehicle" not in new_manifest["classes"]
    assert "vehicle" in manifest["classes"]


def test_export_folder_view_loads_as_folder_tree(library: Path, tmp_path: Path) -> None:
    pytest.importorskip("cairosvg", reason="rendering the miniature needs cairosvg (pip install cairosvg)")
    cache = tmp_path / "cache"
    view = oc.load_openclipart(library, view="folders", min_count=MIN, cache_dir=cache, progress=False)
    out = tmp_path / "out"
    written = oc.export_folder_view(out, library, min_count=MIN, cache_dir=cache, progress=False)
    assert written == {"train": len(view.train), "val": len(view.val), "test": len(view.test)}
    assert sorted(p.name for p in out.iterdir()) == ["test_labels.csv", "train", "val"]  # no test/, no full labels
    tree = load_folder(out, progress=False)
    assert tree.classes == view.classes
    for split in ("train", "val"):
        ours, theirs = getattr(view, split), getattr(tree, split)
        assert sorted(p.name for p in theirs.paths) == sorted(p.name for p in ours.paths)
        mine = {p.name: row.tolist() for p, row in zip(ours.paths, ours.labels, strict=True)}
        assert all(mine[p.name] == row.tolist() for p, row in zip(theirs.paths, theirs.labels, strict=True))
        assert all(p.is_symlink() and p.resolve() in set(ours.paths) for p in theirs.paths)
    scored = load_csv(out / "test_labels.csv")
    index = {name: j for j, name in enumerate(scored.classes)}
    assert sorted(scored.train.paths) == sorted(view.test.paths)
    for path, row in zip(view.test.paths, view.test.labels, strict=True):
        theirs = scored.train.labels[scored.train.paths.index(path)]
        assert {view.classes[j] for j in np.flatnonzero(row)} == {scored.classes[j] for j in np.flatnonzero(theirs)}
        assert all(name in index for name in scored.classes)
    with pytest.raises(DataError, match="not an empty folder"):
        oc.export_folder_view(out, library, min_count=MIN, cache_dir=cache, progress=False)


def test_command_line_report_and_export(library: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cairosvg", reason="rendering the miniature needs cairosvg (pip install cairosvg)")
    out = tmp_path / "tree"
    assert oc.main([str(library), "--min-count", str(MIN), "--cache", str(tmp_path / "cache"), "--quiet", "--rule",
                    "--export-folders", str(out)]) == 0
    printed = capsys.readouterr().out
    for expected in ("batch drawing", "magick:", "images: 11 (train 7, val 2, test 2); classes: 7",
                     "labels per image: 1.82", "folder view:", f"--data folder:{out}"):
        assert expected in printed
    assert (out / "test_labels.csv").is_file() and (out / "train").is_dir()
    assert oc.main([str(tmp_path / "absent"), "--quiet"]) == 2
    assert "apt-get install openclipart-svg" in capsys.readouterr().err
