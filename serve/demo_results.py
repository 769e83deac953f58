"""The demo's pure helpers: threshold choice, the result document, the score HTML, batch table and downloads.

No gradio here: :mod:`serve.demo` lays these out in its Gradio app.
"""

from __future__ import annotations

import base64
import binascii
import csv
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.checkpoint import ModelMeta
    from serve.predictor import Prediction


NEAR_MISS = 0.1  # below the threshold by at most this much: shown as a near miss


def threshold_choice(meta: ModelMeta, use_calibrated: bool, threshold: float) -> tuple[Any, str, str]:
    """``(thresholds (C,), mode, description)`` for the demo's controls, via
    :func:`serve.thresholds.resolve_thresholds`. ``mode`` is ``calibrated``, ``default`` or ``global``."""
    from serve import DEFAULT_THRESHOLD
    from serve.thresholds import resolve_thresholds

    if use_calibrated:
        if meta.thresholds is not None:
            return resolve_thresholds(meta), "calibrated", "calibrated per-class thresholds"
        return (
            resolve_thresholds(meta),
            "default",
            f"{DEFAULT_THRESHOLD} for every class (this model has no calibrated thresholds)",
        )
    value = float(threshold)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    return resolve_thresholds(meta, value), "global", f"global threshold {value:.2f}"


def result_document(prediction: Prediction, model: str, mode: str, seconds: float | None = None) -> dict[str, Any]:
    """What ``/predict`` returns: every class score (model order, full precision), thresholds used, tags."""
    doc: dict[str, Any] = {"model": model, "threshold_mode": mode, **prediction.to_dict()}
    if seconds is not None:
        doc["seconds"] = round(seconds, 4)
    return doc


CSS = """
<style>
.spml-res{font-size:14px;line-height:1.35}
.spml-res .spml-sum{margin:0 0 6px 0}
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


def scores_html(
    prediction: Prediction,
    *,
    description: str,
    truth: Sequence[str] | None = None,
    caption: str = "",
) -> str:
    """Every class as a row: a bar for the score with its own threshold marked, score, threshold, margin and
    status (tag / near miss), highest score first; true labels marked when known."""
    scores, thresholds = prediction.scores, prediction.thresholds
    truth_set = set(truth or [])
    tags = prediction.tags
    esc = html.escape
    if tags:
        chips = "".join(f'<span class="spml-tag">{esc(c)} {scores[c]:.3f}</span>' for c in tags)
        summary = f"<b>{len(tags)} tag{'s' if len(tags) != 1 else ''}:</b> {chips}"
    else:
        top = max(scores, key=lambda c: scores[c] - thresholds[c])
        summary = (
            f"<b>No tag:</b> no class reaches its threshold (closest: {esc(top)} {scores[top]:.3f} "
            f"vs {thresholds[top]:.3f})"
        )
    sub = [esc(description)]
    if caption:
        sub.insert(0, esc(caption))
    if truth is not None:
        missed = [c for c in truth if c not in tags]
        extra = [c for c in tags if c not in truth_set]
        sub.append(
            f'<span class="truth">true labels: {esc(", ".join(truth) or "none")}</span>'
            + (f' · <span class="miss">missed: {esc(", ".join(missed))}</span>' if missed else "")
            + (f' · <span class="miss">not true: {esc(", ".join(extra))}</span>' if extra else "")
        )
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
            f"<td>{status}</td>{true_cell}</tr>"
        )
    return (
        f'{CSS}<div class="spml-res"><div class="spml-sum">{summary}</div>'
        f'<div class="spml-sub">{" · ".join(sub)}</div>'
        f"<table>{header}{''.join(rows)}</table></div>"
    )


EMPTY_HTML = (
    '<div class="spml-res" style="opacity:.7">Upload an image, take a webcam shot, paste one, or pick an example.</div>'
)


@dataclass
class BatchRow:
    """One file of a batch: its display name and scores ``(C,)``, or the reason it could not be read."""

    name: str
    probs: list[float] | None
    error: str = ""


def batch_outputs(
    rows: Sequence[BatchRow], classes: Sequence[str], thresholds: Any, folder: Path
) -> tuple[Any, Path, Path]:
    """Table (pandas DataFrame: file, tags, error, one column per class) and the CSV / JSONL files written into
    ``folder``; the JSONL lines have the format of ``python -m serve tag`` (``{"path", "scores", "tags"}``),
    unreadable files ``{"path", "error"}``."""
    import numpy as np
    import pandas as pd

    from serve.outputs import Selection

    classes = list(classes)
    select = Selection(classes, np.asarray(thresholds))  # the tagging pipeline's selection of tags
    table, csv_rows, lines = [], [], []
    for row in rows:
        if row.probs is None:
            table.append([row.name, "", row.error, *([None] * len(classes))])
            csv_rows.append([row.name, "", row.error, *([""] * len(classes))])
            lines.append({"path": row.name, "error": row.error})
            continue
        rec = select(row.name, np.asarray(row.probs, dtype=np.float64))
        table.append([row.name, ", ".join(rec["tags"]), "", *(round(rec["scores"][c], 3) for c in classes)])
        csv_rows.append([row.name, ";".join(rec["tags"]), "", *(f"{rec['scores'][c]:.6f}" for c in classes)])
        lines.append(rec)
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, jsonl_path = folder / "tags.csv", folder / "tags.jsonl"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["file", "tags", "error", *classes])
        writer.writerows(csv_rows)
    jsonl_path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    frame = pd.DataFrame(table, columns=["file", "tags", "error", *classes])
    return frame, csv_path, jsonl_path


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
