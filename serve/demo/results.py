"""The demo's pure helpers (no gradio): the tag choice, the result document, the score HTML, the batch outputs."""

from __future__ import annotations

import base64
import binascii
import csv
import html
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta
    from serve.outputs.stage import TagSelector
    from serve.predictor import Prediction

NEAR_MISS = 0.1  # below the threshold by at most this much: shown as a near miss


def threshold_choice(meta: ModelMeta, use_calibrated: bool, threshold: float) -> tuple[Any, str, str]:
    """``(thresholds (C,), mode, description)`` of the controls; ``mode``: ``calibrated``, ``default`` or ``global``."""
    from serve import DEFAULT_THRESHOLD
    from serve.outputs.thresholds import resolve_thresholds

    if use_calibrated:
        if meta.thresholds is not None:
            return resolve_thresholds(meta), "calibrated", "calibrated per-class thresholds"
        note = f"{DEFAULT_THRESHOLD} for every class (this model has no calibrated thresholds)"
        return resolve_thresholds(meta), "default", note
    value = float(threshold)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    return resolve_thresholds(meta, value), "global", f"global threshold {value:.2f}"


def tag_choice(meta: ModelMeta, use_calibrated: bool, threshold: float, mode: str = "thresholds",
               k: float | None = None, max_tags: float | None = None, min_score: float | None = None,
               rules: str = "") -> tuple[TagSelector, str, str]:
    """The controls -> ``(selection, threshold mode, description)``; ``ValueError`` on a bad rule."""
    from serve.outputs.caption_rules import parse_rules_text
    from serve.outputs.selection_modes import MODES, make_selection
    from serve.outputs.stage import TagSelector

    thresholds, threshold_mode, description = threshold_choice(meta, use_calibrated, threshold)
    MODES.row(mode)  # the demo's modes are the tagger's (top-k takes its K from a separate control)
    text = f"top-k:{int(k or 0)}" if mode == "top-k" else mode
    cap = int(max_tags) if max_tags else None
    chosen = make_selection(text, cap, float(min_score or 0.0))
    caption_rules = parse_rules_text(rules or "", "caption rules")
    caption_rules.check_classes(meta.classes)
    if not chosen.uses_thresholds:
        description = f"{chosen.describe()} (thresholds not used)"
    elif chosen.describe() != "thresholds":
        description = f"{description}; {chosen.describe().removeprefix('thresholds, ')}"
    return TagSelector(list(meta.classes), thresholds, chosen, caption_rules), threshold_mode, description


def result_document(
    prediction: Prediction, model: str, mode: str, seconds: float | None = None, select: TagSelector | None = None
) -> dict[str, Any]:
    """What ``/predict`` returns: scores, thresholds, tags, and with ``select`` the selection and ``caption``."""
    doc: dict[str, Any] = {"model": model, "threshold_mode": mode, **prediction.to_dict()}
    if select is not None:
        doc["selection"] = select.mode.to_dict()
        doc["caption"] = ", ".join(caption_tags(prediction, select))
    if seconds is not None:
        doc["seconds"] = round(seconds, 4)
    return doc


def caption_tags(prediction: Prediction, select: TagSelector) -> list[str]:
    """The tags of a prediction as written: the pipeline's selection of its scores, caption rules applied."""
    import numpy as np

    return select("", np.array([prediction.scores[c] for c in select.classes]))["tags"]


CSS = """
<style>
.spml-res{font-size:14px;line-height:1.35}
.spml-res .spml-sum{margin:0 0 6px 0}
.spml-res .spml-cap{margin:4px 0 0 0}
.spml-res .spml-tag{display:inline-block;padding:1px 8px;margin:2px 4px 2px 0;border-radius:10px;
  background:rgba(34,160,80,.18);border:1px solid rgba(34,160,80,.55)}
.spml-res .spml-sub{opacity:.75;font-size:12px;margin-bottom:6px}
.spml-res table{border-collapse:collapse;width:100%}
.spml-res td,.spml-res th{padding:3px 8px;text-align:left;white-space:nowrap}
.spml-res th{font-weight:600;border-bottom:1px solid rgba(128,128,128,.5)}
.spml-res td{border-bottom:1px solid rgba(128,128,128,.15)}
.spml-res td.num{text-align:right;font-variant-numeric:tabular-nums}
.spml-res .bar{position:relative;width:140px;height:12px;background:rgba(128,128,128,.18);border-radius:3px}
.spml-res .fill{position:absolute;left:0;top:0;bottom:0;border-radius:3px;background:rgba(128,128,128,.55)}
.spml-res tr.above .fill{background:rgba(34,160,80,.85)}
.spml-res tr.near .fill{background:rgba(230,150,20,.85)}
.spml-res .mark{position:absolute;top:-3px;bottom:-3px;width:2px;background:currentColor}
.spml-res tr.above td.name{font-weight:600}
.spml-res .truth{color:rgb(40,120,220)}
.spml-res .miss{color:rgb(200,60,60)}
</style>
"""


def scores_html(prediction: Prediction, *, description: str, truth: Sequence[str] | None = None, caption: str = "",
                written: str | None = None) -> str:
    """Every class as a row (score bar, threshold, margin, status), highest first; true labels marked."""
    scores, thresholds = prediction.scores, prediction.thresholds
    truth_set = set(truth or [])
    tags = prediction.tags
    esc = html.escape
    if tags:
        chips = "".join(f'<span class="spml-tag">{esc(c)} {scores[c]:.3f}</span>' for c in tags)
        summary = f"<b>{len(tags)} tag{'s' if len(tags) != 1 else ''}:</b> {chips}"
    else:
        top = max(scores, key=lambda c: scores[c] - thresholds[c])
        summary = (f"<b>No tag:</b> no class reaches its threshold (closest: {esc(top)} {scores[top]:.3f} "
                   f"vs {thresholds[top]:.3f})")
    if written is not None:
        summary += f'<div class="spml-cap"><b>caption:</b> <code>{esc(written) or "(empty)"}</code></div>'
    sub = [esc(description)]
    if caption:
        sub.insert(0, esc(caption))
    if truth is not None:
        missed = [c for c in truth if c not in tags]
        extra = [c for c in tags if c not in truth_set]
        sub.append(
            f'<span class="truth">true labels: {esc(", ".join(truth) or "none")}</span>'
            + (f' · <span class="miss">missed: {esc(", ".join(missed))}</span>' if missed else "")
            + (f' · <span class="miss">not true: {esc(", ".join(extra))}</span>' if extra else ""))
    header = "<tr><th>class</th><th>score (| = threshold)</th><th>score</th><th>threshold</th><th>margin</th>"
    header += "<th>status</th>" + ("<th>true</th>" if truth is not None else "") + "</tr>"
    rows = []
    for name in sorted(scores, key=lambda c: (-scores[c], c)):
        s, t = scores[name], thresholds[name]
        above = name in tags
        state = "above" if above else ("near" if t - s <= NEAR_MISS else "below")
        status = {"above": "tag", "near": "near miss", "below": ""}[state]
        true_cell = f"<td>{'✓' if name in truth_set else ''}</td>" if truth is not None else ""
        rows.append(
            f'<tr class="{state}" data-class="{esc(name)}"><td class="name">{esc(name)}</td>'
            f'<td><div class="bar"><div class="fill" style="width:{100 * s:.1f}%"></div>'
            f'<div class="mark" style="left:calc({100 * t:.1f}% - 1px)"></div></div></td>'
            f'<td class="num">{s:.3f}</td><td class="num">{t:.3f}</td><td class="num">{s - t:+.3f}</td>'
            f"<td>{status}</td>{true_cell}</tr>")
    return (f'{CSS}<div class="spml-res"><div class="spml-sum">{summary}</div><div class="spml-sub">{" · ".join(sub)}'
            f"</div><table>{header}{''.join(rows)}</table></div>")


EMPTY_HTML = ('<div class="spml-res" style="opacity:.7">Upload an image, take a webcam shot, paste one, or pick an '
              "example.</div>")


@dataclass
class BatchRow:
    """One file of a batch: its display name and scores ``(C,)``, or the reason it could not be read."""

    name: str
    probs: list[float] | None
    error: str = ""


def batch_outputs(rows: Sequence[BatchRow], select: TagSelector, folder: Path) -> tuple[Any, Path, Path, Path]:
    """The batch table (a DataFrame) and its CSV, JSONL and captions zip written into ``folder``."""
    import numpy as np
    import pandas as pd

    classes = list(select.classes)
    table, csv_rows, lines, captions = [], [], [], {}
    for row, name in zip(rows, caption_names([r.name for r in rows]), strict=True):
        if row.probs is None:
            table.append([row.name, "", row.error, *([None] * len(classes))])
            csv_rows.append([row.name, "", row.error, *([""] * len(classes))])
            lines.append({"path": row.name, "error": row.error})
            continue
        rec = select(row.name, np.asarray(row.probs, dtype=np.float64))
        table.append([row.name, ", ".join(rec["tags"]), "", *(round(rec["scores"][c], 3) for c in classes)])
        csv_rows.append([row.name, ";".join(rec["tags"]), "", *(f"{rec['scores'][c]:.6f}" for c in classes)])
        lines.append(rec)
        captions[name] = ", ".join(rec["tags"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, jsonl_path, zip_path = folder / "tags.csv", folder / "tags.jsonl", folder / "captions.zip"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["file", "tags", "error", *classes])
        writer.writerows(csv_rows)
    jsonl_path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in captions.items():
            archive.writestr(name, text)
    frame = pd.DataFrame(table, columns=["file", "tags", "error", *classes])
    return frame, csv_path, jsonl_path, zip_path


def caption_names(names: Sequence[str]) -> list[str]:
    """The caption file of each uploaded file name, named as sidecars are (repeats get ``a-2.txt``)."""
    from serve.outputs.sidecars import SidecarSpec, sidecar_paths

    unique: list[Path] = []
    for name in names:
        path, n = Path(Path(name).name or "image"), 1
        while path in unique:
            n += 1
            path = Path(f"{Path(name).stem}-{n}{Path(name).suffix}")
        unique.append(path)
    found = sidecar_paths(Path(), unique, SidecarSpec())
    return [found[p]["txt"].as_posix() for p in unique]


def payload_image(payload: Any) -> tuple[str | bytes, str]:
    """A gradio file payload (dict with ``path`` / ``url`` / ``orig_name``) or a path -> (image input, name)."""
    if isinstance(payload, (str, Path)):
        return str(payload), Path(payload).name
    if isinstance(payload, dict):
        path = payload.get("path")
        name = payload.get("orig_name") or (Path(path).name if path else "image")
        if path:
            return str(path), str(name)
        url = str(payload.get("url") or "")
        if url.startswith("data:") and "," in url:
            try:
                return base64.b64decode(url.split(",", 1)[1], validate=True), str(name)
            except (binascii.Error, ValueError):
                pass
    raise ValueError("no readable image in the request")


def file_bytes(image: str | bytes) -> bytes:
    if isinstance(image, bytes):
        return image
    with open(image, "rb") as fh:
        return fh.read()
