"""The Tux Paint stamps dataset kind (models/sources/tuxpaint.py) on a miniature of the Debian package's layout:
``<category>/[<sub-folder>/]<name>.png`` with ``<name>.txt`` (English first line, then translations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from models.data.registry import describe_kinds, load_dataset, spec_dataset_name
from models.data.types import DataError
from models.sources import tuxpaint as tp

MIN = 2


def _png(path: Path, colour: tuple[int, int, int], shape: str, size: int = 120) -> None:
    """A transparent PNG with one coloured shape (distinct colour/shape pairs give distinct rasters)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    box = (size // 5, size // 4, 4 * size // 5, 3 * size // 4)
    (draw.ellipse if shape == "ellipse" else draw.rectangle)(box, fill=(*colour, 255))
    image.save(path)


def _stamp(root: Path, relative: str, colour: tuple[int, int, int], description: str | None,
           shape: str = "ellipse") -> None:
    _png(root / f"{relative}.png", colour, shape)
    if description is not None:
        (root / f"{relative}.txt").write_text(f"{description}\nfr.utf8=Traduction.\n", encoding="utf-8")


@pytest.fixture
def stamps(tmp_path: Path) -> Path:
    """A miniature stamps folder: animals/mammals (3), animals/birds (2, one with a numbered variant), food/fruit
    (3, one an SVG), a cartoon style folder, an alphabet (dropped), a duplicate raster, a blank stamp, one stamp
    whose labels are all rare."""
    pytest.importorskip("cairosvg", reason="the SVG stamp needs cairosvg (pip install cairosvg)")
    root = tmp_path / "stamps"
    _stamp(root, "animals/mammals/cow", (90, 60, 20), "A brown cow.")
    _stamp(root, "animals/mammals/cartoon/dog", (200, 150, 90), "A happy brown dog.", "rectangle")
    _stamp(root, "animals/mammals/cat", (20, 20, 20), "A black cat.")
    _stamp(root, "animals/birds/robin", (220, 40, 30), "A red robin.")
    _stamp(root, "animals/birds/robin-1", (230, 60, 40), "A red robin, flying.", "rectangle")
    _stamp(root, "food/fruit/apple", (230, 10, 10), "A red apple.")
    _stamp(root, "food/fruit/banana", (240, 230, 40), "A yellow banana.", "rectangle")
    _stamp(root, "food/fruit/apple_copy", (230, 10, 10), None)  # identical raster to apple: merged
    _stamp(root, "symbols/alphabets/english/A", (0, 0, 0), "The letter A.")
    _stamp(root, "misc/zebra", (128, 128, 128), "A zebra.")  # every label rare
    svg = root / "food/fruit/cherry.svg"  # an SVG-only stamp, rendered with cairosvg
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="80" height="40"><circle cx="20" cy="20" r="15" '
                   'fill="#c00000"/></svg>', encoding="utf-8")
    (root / "food/fruit/cherry.txt").write_text("A red cherry.\n", encoding="utf-8")
    blank = root / "food/fruit/ghost.png"
    Image.new("RGBA", (50, 50), (255, 255, 255, 0)).save(blank)
    return root


def _build(stamps: Path, tmp_path: Path, **kwargs: object) -> tuple[Path, dict]:
    return tp.ensure_tuxpaint(stamps, min_count=MIN, cache_dir=tmp_path / "cache", progress=False, **kwargs)  # type: ignore[arg-type]


def test_labels_from_folders_and_descriptions() -> None:
    assert tp.folder_labels("animals/mammals/bovines/cow") == ["animal", "mammal", "bovine"]
    assert tp.folder_labels("animals/dinosaur/cartoon/rex") == ["animal", "dinosaur"]  # a style folder is no label
    assert tp.description_labels("A US 5 cent piece ($.05) called a nickel.") == ["cent", "nickel"]
    assert tp.description_labels("Grandma’s old rag doll.") == ["doll", "grandma", "old", "rag"]
    assert tp.description_labels("Two red apples.") == ["apple", "red"]
    assert tp.stamp_group("animals/amphibians/frog-1") == tp.stamp_group("animals/amphibians/frog")
    assert tp.stamp_group("plants/flowers/flower7") == "plants/flowers/flower"
    assert tp.stamp_group("symbols/chess/w_4_knight") == "symbols/chess/w_4_knight"  # a number inside the name stays


def test_build_applies_the_rule(stamps: Path, tmp_path: Path) -> None:
    folder, manifest = _build(stamps, tmp_path)
    left = {entry["stamp"]: entry["reason"] for entry in manifest["left_out"]}
    assert left["symbols/alphabets/english/A"] == "dropped folder"
    assert left["food/fruit/ghost"] == "not rasterised"
    assert left["food/fruit/apple_copy"] == "merged duplicate"
    assert left["misc/zebra"] == "no frequent label"
    by_stamp = {image["stamp"]: image for image in manifest["images"]}
    assert set(by_stamp) == {"animals/mammals/cow", "animals/mammals/cartoon/dog", "animals/mammals/cat",
                             "animals/birds/robin", "animals/birds/robin-1", "food/fruit/apple", "food/fruit/banana",
                             "food/fruit/cherry"}
    # classes: labels on >= 2 images (folder names merged to the singular, description words)
    assert manifest["classes"] == ["animal", "bird", "brown", "food", "fruit", "mammal", "red", "robin"]
    assert by_stamp["animals/mammals/cartoon/dog"]["labels"] == ["animal", "brown", "mammal"]
    assert by_stamp["food/fruit/apple"]["labels"] == ["food", "fruit", "red"]  # "apple" is on one image only
    assert by_stamp["food/fruit/apple"]["sources"] == ["food/fruit/apple.png", "food/fruit/apple_copy.png"]
    assert by_stamp["animals/birds/robin"]["folder_class"] == "bird"
    assert by_stamp["food/fruit/cherry"]["sources"] == ["food/fruit/cherry.svg"]
    # variants of one drawing share a split
    assert by_stamp["animals/birds/robin"]["split"] == by_stamp["animals/birds/robin-1"]["split"]
    for image in manifest["images"]:
        with Image.open(folder / image["file"]) as raster:
            assert raster.mode == "RGB" and max(raster.size) == tp.RASTER_SIZE
            assert raster.getpixel((0, 0)) == (255, 255, 255)  # transparent background flattened on white


def test_loader_views_cache_and_registry(stamps: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPML_CACHE", str(tmp_path / "cache"))
    splits = load_dataset(f"tuxpaint:{stamps}?min-count={MIN}")
    assert splits.name == "tuxpaint" and splits.complete_splits == ("train", "val", "test")
    total = sum(len(part) for part in (splits.train, splits.val, splits.test) if part is not None)
    assert total == 8 and len(splits.classes) == 8
    assert all(part is None or part.labels.sum(1).min() >= 1 for part in (splits.train, splits.val, splits.test))
    rasters = sorted((tmp_path / "cache" / "tuxpaint").glob("*/images/*.png"))
    stamps_before = [p.stat().st_mtime_ns for p in rasters]
    again = load_dataset(f"tuxpaint:{stamps}?min-count={MIN}")  # from the manifest: nothing rasterised again
    assert [p.stat().st_mtime_ns for p in rasters] == stamps_before
    assert again.train.paths == splits.train.paths and np.array_equal(again.train.labels, splits.train.labels)
    folders = load_dataset(f"tuxpaint:{stamps}?view=folders&min-count={MIN}")
    assert folders.name == "tuxpaint-folders" and folders.complete_splits == ("test",)
    assert folders.train.labels.sum(1).max() == 1  # one positive per training image: its deepest folder class
    assert set(folders.classes) <= {"animal", "bird", "food", "fruit", "mammal"}
    assert spec_dataset_name("tuxpaint") == "tuxpaint"
    assert spec_dataset_name(f"tuxpaint:{stamps}?view=folders") == "tuxpaint-folders"
    assert "tuxpaint" in describe_kinds()


def test_missing_folder_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="tuxpaint-stamps-default"):
        tp.ensure_tuxpaint(tmp_path / "nowhere", cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match="min-count"):
        load_dataset(f"tuxpaint:{tmp_path}?min-count=0")
    with pytest.raises(DataError, match="unknown"):
        load_dataset(f"tuxpaint:{tmp_path}?colour=red")
    with pytest.raises(DataError, match="unknown option 'colour'"):  # no source given: the default's options
        load_dataset("tuxpaint?colour=red")


def test_command_line_report(stamps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tp.main([str(stamps), "--min-count", str(MIN), "--cache", str(tmp_path / "cache"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "images: 8" in out and "1 dropped folder" in out and "classes: 8" in out
    assert tp.main([str(tmp_path / "nowhere"), "--cache", str(tmp_path / "cache")]) == 2
