"""Sidecar formats: the JSON document, and XMP keywords as a real XMP reader (Exiv2, through pyexiv2) sees them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve.sidecar_formats import json_sidecar, parse_formats, xmp_keywords, xmp_sidecar

TAGS = ["cat", "red car", "a&b <x>", "café"]


def test_json_sidecar_holds_tags_and_every_score() -> None:
    doc = json.loads(json_sidecar(["cat"], {"cat": 0.91, "dog": 0.02}, {"selection": "mcut"}))
    assert doc == {"tags": ["cat"], "scores": {"cat": 0.91, "dog": 0.02}, "selection": "mcut"}


def test_xmp_round_trip() -> None:
    assert xmp_keywords(xmp_sidecar(TAGS)) == TAGS
    assert xmp_keywords(xmp_sidecar([])) == []
    with pytest.raises(ValueError, match="not an XMP document"):
        xmp_keywords("cat, dog")


def test_exiv2_reads_the_keywords(tmp_path: Path) -> None:
    pyexiv2 = pytest.importorskip("pyexiv2")
    path = tmp_path / "a.jpg.xmp"
    path.write_text(xmp_sidecar(TAGS), encoding="utf-8")
    image = pyexiv2.Image(str(path))
    try:
        assert image.read_xmp()["Xmp.dc.subject"] == TAGS
    finally:
        image.close()


def test_format_lists() -> None:
    assert parse_formats("txt, JSON,txt") == ("txt", "json")
    for bad in ("", "csv", "txt,yaml"):
        with pytest.raises(ValueError, match="txt, json, xmp"):
            parse_formats(bad)
