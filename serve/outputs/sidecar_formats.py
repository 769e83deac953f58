"""What a sidecar holds, per format of :data:`SIDECAR_FORMATS` (``txt``, ``json``, ``xmp``); an existing one is updated,
its other contents kept."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from io import StringIO
from typing import Any

from models.registry import Row, Table
from serve.outputs.records import split_tags

#: ``(existing tags, new tags) -> tags``: how an update combines them (e.g. keep the new ones only, or merge).
Combine = Callable[[Sequence[str], Sequence[str]], list[str]]


_NS = {
    "x": "adobe:ns:meta/",
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "dc": "http://purl.org/dc/elements/1.1/"}
for _prefix, _uri in _NS.items():
    ET.register_namespace(_prefix, _uri)


def json_sidecar(tags: Sequence[str], scores: Mapping[str, float], extra: Mapping[str, Any] | None = None) -> str:
    """The JSON sidecar text: ``{"tags": [...], "scores": {class: p}, ...extra}``."""
    return json.dumps({"tags": list(tags), "scores": dict(scores), **(extra or {})}, ensure_ascii=False,
                      indent=1) + "\n"


def json_updated(existing: str, tags: Sequence[str], scores: Mapping[str, float], extra: Mapping[str, Any],
                 combine: Combine) -> str:
    """An existing JSON sidecar with new scores, ``extra`` and combined tags (``ValueError``: not an object)."""
    try:
        doc = json.loads(existing)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a JSON document ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    old = doc.get("tags")
    old_tags = [str(t) for t in old] if isinstance(old, list) else []
    doc.update({"tags": combine(old_tags, tags), "scores": dict(scores), **extra})
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def _xmp_document(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n' + ET.tostring(root, encoding="unicode") \
        + '\n<?xpacket end="w"?>\n'


def _xmp_root(text: str) -> ET.Element:
    """The parsed XMP document, its namespace prefixes registered (``ValueError`` when it is not XML)."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("<?xpacket"))
    try:
        for _, (prefix, uri) in ET.iterparse(StringIO(body), events=("start-ns",)):
            if prefix and not prefix.startswith("ns"):
                ET.register_namespace(prefix, uri)
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise ValueError(f"not an XMP document ({exc})") from None


def xmp_sidecar(tags: Sequence[str]) -> str:
    """An XMP sidecar document whose ``dc:subject`` bag holds ``tags`` (XMP keywords)."""
    rdf = _NS["rdf"]
    root = ET.Element(f"{{{_NS['x']}}}xmpmeta")
    graph = ET.SubElement(root, f"{{{rdf}}}RDF")
    ET.SubElement(graph, f"{{{rdf}}}Description", {f"{{{rdf}}}about": ""})
    _set_keywords(root, tags)
    return _xmp_document(root)


_SUBJECT = f"{{{_NS['dc']}}}subject"
_BAG = f"{{{_NS['rdf']}}}Bag"
_LI = f"{{{_NS['rdf']}}}li"
_DESCRIPTION = f"{{{_NS['rdf']}}}Description"


def _set_keywords(root: ET.Element, tags: Sequence[str]) -> None:
    """Make ``tags`` the ``dc:subject`` bag of the document (in the description that has one, else the first)."""
    holder = next((d for d in root.iter(_DESCRIPTION) if d.find(_SUBJECT) is not None), None)
    if holder is None:
        holder = next(root.iter(_DESCRIPTION), None)
    if holder is None:
        graph = next(root.iter(f"{{{_NS['rdf']}}}RDF"), None)
        if graph is None:
            raise ValueError("not an XMP document (no rdf:RDF)")
        holder = ET.SubElement(graph, _DESCRIPTION, {f"{{{_NS['rdf']}}}about": ""})
    subject = holder.find(_SUBJECT)
    if subject is None:
        subject = ET.SubElement(holder, _SUBJECT)
    for child in list(subject):
        subject.remove(child)
    bag = ET.SubElement(subject, _BAG)
    for tag in tags:
        ET.SubElement(bag, _LI).text = tag


def xmp_keywords(text: str) -> list[str]:
    """The ``dc:subject`` keywords of an XMP document (``ValueError`` when it is not XML)."""
    root = _xmp_root(text)
    return [li.text or "" for li in root.iterfind(f".//{_SUBJECT}/{_BAG}/{_LI}")]


def xmp_updated(existing: str, tags: Sequence[str], combine: Combine) -> str:
    """An existing XMP sidecar with its keywords ``combine``-d with ``tags``, the rest kept (``ValueError``)."""
    root = _xmp_root(existing)
    old = [li.text or "" for li in root.iterfind(f".//{_SUBJECT}/{_BAG}/{_LI}")]
    _set_keywords(root, combine(old, tags))
    return _xmp_document(root)


def merge_tags(existing: Sequence[str], new: Sequence[str]) -> list[str]:
    """``existing`` followed by the tags of ``new`` not already in it (each tag once)."""
    out = list(dict.fromkeys(existing))
    out.extend(t for t in new if t not in out)
    return out


def replace_tags(existing: Sequence[str], new: Sequence[str]) -> list[str]:
    """The ``new`` tags (an update that replaces)."""
    return list(new)


#: ``(existing text or None, tags, scores, extra fields, tag separator, append) -> the file's text``.
Render = Callable[[str | None, Sequence[str], Mapping[str, float], Mapping[str, Any], str, bool], str]


def _txt(existing: str | None, tags: Sequence[str], scores: Mapping[str, float], extra: Mapping[str, Any],
         separator: str, append: bool) -> str:
    if append and existing is not None:
        tags = merge_tags(split_tags(existing, separator), tags)
    return separator.join(tags) + "\n"


def _json(existing: str | None, tags: Sequence[str], scores: Mapping[str, float], extra: Mapping[str, Any],
          separator: str, append: bool) -> str:
    if existing is None or not append:
        return json_sidecar(tags, scores, extra)
    return json_updated(existing, tags, scores, extra, merge_tags)


def _xmp(existing: str | None, tags: Sequence[str], scores: Mapping[str, float], extra: Mapping[str, Any],
         separator: str, append: bool) -> str:
    if existing is None:
        return xmp_sidecar(tags)
    return xmp_updated(existing, tags, merge_tags if append else replace_tags)


@dataclass(frozen=True)
class SidecarFormat:
    """A sidecar format: its ``suffix`` (None: ``--sidecar-ext``), whether it keeps the image suffix, ``render``."""

    suffix: str | None
    after_image_name: bool
    render: Render


#: The sidecar formats: ``a.jpg`` -> ``a.txt`` / ``a.json`` / ``a.jpg.xmp``.
SIDECAR_FORMATS: Table[SidecarFormat] = Table("sidecar format", [
    Row("txt", "the tags joined by the separator (--sidecar-ext, default .txt)", SidecarFormat(None, False, _txt)),
    Row("json", "every score and the tags (.json)", SidecarFormat(".json", False, _json)),
    Row("xmp", "the tags as XMP keywords for photo managers (<image name>.xmp)", SidecarFormat(".xmp", True, _xmp)),
])


def parse_formats(text: str) -> tuple[str, ...]:
    """``"txt,json"`` -> ``("txt", "json")``; ``ValueError`` naming the known formats otherwise."""
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    if not formats:
        raise ValueError(f"sidecar formats are a comma-separated list of {', '.join(SIDECAR_FORMATS)}; got {text!r}")
    for name in formats:
        SIDECAR_FORMATS.row(name)  # an unknown format: the one message listing them
    return formats
