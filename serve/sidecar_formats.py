"""What a sidecar file holds, per format: ``txt`` (the tags joined by the separator), ``json`` (every score and
the selected tags) and ``xmp`` (the tags as XMP keywords, ``dc:subject``, in an Adobe XMP sidecar that
darktable, digiKam and other photo managers read as ``<image name>.xmp``; the images themselves are never
modified).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

#: Sidecar formats and the suffix each adds: ``a.jpg`` -> ``a.txt`` / ``a.json`` / ``a.jpg.xmp``.
SIDECAR_FORMATS = ("txt", "json", "xmp")

_NS = {
    "x": "adobe:ns:meta/",
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "dc": "http://purl.org/dc/elements/1.1/",
}
for _prefix, _uri in _NS.items():
    ET.register_namespace(_prefix, _uri)


def parse_formats(text: str) -> tuple[str, ...]:
    """``"txt,json"`` -> ``("txt", "json")``; ``ValueError`` naming the known formats otherwise."""
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in SIDECAR_FORMATS]
    if unknown or not formats:
        raise ValueError(f"sidecar formats are a comma-separated list of {', '.join(SIDECAR_FORMATS)}; got {text!r}")
    return formats


def json_sidecar(tags: Sequence[str], scores: Mapping[str, float], extra: Mapping[str, Any] | None = None) -> str:
    """The JSON sidecar text: ``{"tags": [...], "scores": {class: p}, ...extra}``."""
    return json.dumps({"tags": list(tags), "scores": dict(scores), **(extra or {})}, ensure_ascii=False,
                      indent=1) + "\n"


def xmp_sidecar(tags: Sequence[str]) -> str:
    """An XMP sidecar document whose ``dc:subject`` bag holds ``tags`` (XMP keywords)."""
    rdf = _NS["rdf"]
    root = ET.Element(f"{{{_NS['x']}}}xmpmeta")
    graph = ET.SubElement(root, f"{{{rdf}}}RDF")
    desc = ET.SubElement(graph, f"{{{rdf}}}Description", {f"{{{rdf}}}about": ""})
    bag = ET.SubElement(ET.SubElement(desc, f"{{{_NS['dc']}}}subject"), f"{{{rdf}}}Bag")
    for tag in tags:
        ET.SubElement(bag, f"{{{rdf}}}li").text = tag
    ET.indent(root)
    return '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n' + ET.tostring(root, encoding="unicode") \
        + '\n<?xpacket end="w"?>\n'


def xmp_keywords(text: str) -> list[str]:
    """The ``dc:subject`` keywords of an XMP document (for appending to an existing sidecar); ``ValueError`` when
    it is not XML."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("<?xpacket"))
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise ValueError(f"not an XMP document ({exc})") from None
    path = f".//{{{_NS['dc']}}}subject/{{{_NS['rdf']}}}Bag/{{{_NS['rdf']}}}li"
    return [li.text or "" for li in root.iterfind(path)]
