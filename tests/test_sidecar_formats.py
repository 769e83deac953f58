"""Sidecar formats: the JSON document, and XMP keywords as a real XMP reader (Exiv2, through pyexiv2) sees them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve.outputs.sidecar_formats import (
    json_sidecar,
    json_updated,
    merge_tags,
    parse_formats,
    xmp_keywords,
    xmp_sidecar,
    xmp_updated,
)

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


#: An XMP sidecar a photo manager wrote: a rating and a label in another namespace, and keywords of its own.
MANAGER_XMP = """<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about="" xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/"
    xmp:Rating="4" xmp:Label="Red">
   <dc:subject><rdf:Bag><rdf:li>holiday</rdf:li><rdf:li>cat</rdf:li></rdf:Bag></dc:subject>
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
<?xpacket end="w"?>
"""


def test_updates_keep_what_other_tools_wrote(tmp_path: Path) -> None:
    """``--existing append`` merges the keywords; a replacing update changes only the keywords; a photo manager's
    rating and label survive both (read back by Exiv2 when pyexiv2 is installed)."""
    merged = xmp_updated(MANAGER_XMP, ["dog", "cat"], merge_tags)
    replaced = xmp_updated(MANAGER_XMP, ["dog"], lambda old, new: list(new))
    assert xmp_keywords(merged) == ["holiday", "cat", "dog"] and xmp_keywords(replaced) == ["dog"]
    for text in (merged, replaced):
        assert 'Rating="4"' in text and 'Label="Red"' in text
    doc = json.loads(json_updated(json.dumps({"tags": ["mine"], "note": "kept"}), ["cat"], {"cat": 0.9},
                                  {"selection": "mcut"}, merge_tags))
    assert doc == {"tags": ["mine", "cat"], "note": "kept", "scores": {"cat": 0.9}, "selection": "mcut"}
    with pytest.raises(ValueError, match="not a JSON object"):
        json_updated("[1, 2]", ["cat"], {}, {}, merge_tags)
    pyexiv2 = pytest.importorskip("pyexiv2")
    path = tmp_path / "a.jpg.xmp"
    path.write_text(merged, encoding="utf-8")
    image = pyexiv2.Image(str(path))
    try:
        xmp = image.read_xmp()
    finally:
        image.close()
    assert xmp["Xmp.dc.subject"] == ["holiday", "cat", "dog"] and xmp["Xmp.xmp.Rating"] == "4"
    assert xmp["Xmp.xmp.Label"] == "Red"
