"""Per-class decision thresholds calibrated on validation scores (tagged when the probability is ``>=`` the threshold)
and a report of what they change (modes: docs/export.md). A threshold sits at the midpoint to the next lower distinct
score (runtime differences cannot flip a decision), clamped to ``[1e-6, 1 - 1e-6]``; a class with fewer than
``min_positives`` positives gets the criterion's pooled optimum; :attr:`Calibration.rules` records each rule."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.evaluation.metrics import f1_scores

__all__ = [
    "DEFAULT_MIN_POSITIVES",
    "DEFAULT_THRESHOLD",
    "MODES_HELP",
    "THRESHOLD_MAX",
    "THRESHOLD_MIN",
    "Calibration",
    "CalibrationMode",
    "calibrate",
    "calibration_report",
    "default_mode",
    "parse_mode",
    "plot_pr_curves",
    "write_report"]

DEFAULT_THRESHOLD = 0.5
DEFAULT_MIN_POSITIVES = 5
THRESHOLD_MIN = 1e-6
THRESHOLD_MAX = 1.0 - 1e-6
MODES_HELP = "f1, pu, pu-f1[:K], rate[:K] (K > 0), recall:R (0 < R <= 1), threshold:X or X (0 < X < 1)"
_TIE_RTOL = 1e-12


@dataclass(frozen=True)
class CalibrationMode:
    """A parsed mode: ``kind`` (``f1``, ``pu``, ``pu-f1``, ``rate``, ``recall``, ``threshold``) and its value."""

    kind: str
    value: float | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.value:g}" if self.value is not None else self.kind


@dataclass
class Calibration:
    """The result of :func:`calibrate`: per class, the threshold, the rule that set it (the mode, ``"fixed"`` or
    ``"fallback:..."``) and the validation positives; ``fallback_threshold`` is the pooled one."""

    mode: str
    thresholds: list[float]
    rules: list[str]
    positives: list[int]
    min_positives: int
    fallback_threshold: float | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return {
            "mode": self.mode,
            "thresholds": [float(t) for t in self.thresholds],
            "rules": list(self.rules),
            "positives": [int(n) for n in self.positives],
            "min_positives": int(self.min_positives),
            "fallback_threshold": None if self.fallback_threshold is None else float(self.fallback_threshold)}


def _parse_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_mode(text: str) -> CalibrationMode:
    """Parse a CLI mode string (or a bare number X) into a :class:`CalibrationMode`; ``ValueError`` otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"calibration mode must be a string ({MODES_HELP}), got {type(text).__name__}")
    clean = text.strip().lower()
    if clean in ("f1", "pu", "pu-f1", "rate"):
        return CalibrationMode(clean)
    for kind in ("pu-f1", "rate"):
        if clean.startswith(f"{kind}:"):
            value = _parse_number(clean.split(":", 1)[1])
            if value is None or not value > 0.0:
                raise ValueError(f"invalid calibration mode {text!r}: {kind}:K needs a number K > 0 (expected "
                                 "positives per image)")
            return CalibrationMode(kind, value)
    if clean.startswith("recall:"):
        value = _parse_number(clean.split(":", 1)[1])
        if value is None or not 0.0 < value <= 1.0:
            raise ValueError(f"invalid calibration mode {text!r}: recall:R needs a number R with 0 < R <= 1")
        return CalibrationMode("recall", value)
    explicit = clean.startswith("threshold:")
    value = _parse_number(clean.split(":", 1)[1] if explicit else clean)
    if value is None:
        if explicit:
            raise ValueError(f"invalid calibration mode {text!r}: threshold:X needs a number X with 0 < X < 1")
        raise ValueError(f"invalid calibration mode {text!r}: use {MODES_HELP}")
    if not 0.0 < value < 1.0:
        raise ValueError(f"invalid calibration mode {text!r}: a fixed threshold must satisfy 0 < X < 1")
    return CalibrationMode("threshold", value)


def default_mode(fully_labelled: bool) -> str:
    """The default mode: ``"f1"`` with complete validation labels, else ``"rate"`` (bench/README.md)."""
    return "f1" if fully_labelled else "rate"


def _check_inputs(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 probabilities and boolean labels, both (N, C) with N, C >= 1."""
    p = np.asarray(probs)
    y = np.asarray(labels)
    if p.ndim != 2 or y.ndim != 2:
        raise ValueError(f"probs and labels must both be 2-D (N images, C classes); got {p.shape} and {y.shape}")
    if p.shape != y.shape:
        raise ValueError(f"probs and labels must have the same shape; got {p.shape} and {y.shape}")
    if p.shape[0] == 0 or p.shape[1] == 0:
        raise ValueError(f"need at least one image and one class; got shape {p.shape}")
    if not (np.issubdtype(p.dtype, np.floating) or np.issubdtype(p.dtype, np.integer)):
        raise ValueError(f"probs must be numbers, got dtype {p.dtype}")
    p = p.astype(np.float64)
    bad = ~np.isfinite(p)
    if bad.any():
        i, c = np.argwhere(bad)[0]
        raise ValueError(f"probs contain {int(bad.sum())} NaN/inf value(s), first at image {i}, class {c}")
    if p.min() < 0.0 or p.max() > 1.0:
        raise ValueError(f"probs must be probabilities in [0, 1] (apply a sigmoid to logits first); "
                         f"got values in [{p.min():g}, {p.max():g}]")
    if y.dtype != np.bool_:
        if not (np.issubdtype(y.dtype, np.number)):
            raise ValueError(f"labels must be 0/1 numbers or booleans, got dtype {y.dtype}")
        not01 = (y != 0) & (y != 1)
        if not01.any():
            i, c = np.argwhere(not01)[0]
            raise ValueError(f"labels must be 0 or 1; found {y[i, c]!r} at image {i}, class {c}")
    return p, y.astype(bool)


def _check_names(classes: Sequence[object], num_classes: int) -> list[str]:
    """The class names as strings; ``ValueError`` unless there is one per class."""
    names = [str(c) for c in classes]
    if len(names) != num_classes:
        raise ValueError(f"got {len(names)} class names for {num_classes} classes")
    return names


def _check_thresholds(thresholds: Any, num_classes: int) -> np.ndarray:
    t = np.asarray(thresholds, dtype=np.float64)
    if t.ndim == 0:
        t = np.full(num_classes, float(t))
    if t.shape != (num_classes,):
        raise ValueError(f"need one threshold per class ({num_classes}); got shape {t.shape}")
    if not np.isfinite(t).all() or t.min() < 0.0 or t.max() > 1.0:
        raise ValueError("thresholds must be finite probabilities in [0, 1]")
    return t


def _clamp(threshold: float) -> float:
    return float(min(max(threshold, THRESHOLD_MIN), THRESHOLD_MAX))


def _cut_table(scores: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every cut of a score vector, highest first: distinct scores ``s``, and ``tp`` and ``n_pred`` at ``>= s[j]``."""
    order = np.argsort(-scores, kind="mergesort")
    s = scores[order]
    tp = np.cumsum(positives[order])
    last = np.r_[np.flatnonzero(s[1:] != s[:-1]), len(s) - 1]  # last index of each group of tied scores
    return s[last], tp[last].astype(np.float64), (last + 1).astype(np.float64)


def _threshold_below(distinct: np.ndarray, j: int) -> float:
    """The (clamped) midpoint between the cut score ``distinct[j]`` and the next lower distinct score."""
    upper = float(distinct[j])
    lower = float(distinct[j + 1]) if j + 1 < len(distinct) else 0.0
    mid = 0.5 * (upper + lower)
    if not lower < mid <= upper:  # adjacent floats (or both 0): the score itself keeps the cut exact
        mid = upper
    return _clamp(mid)


def _rate_threshold(scores: np.ndarray, prior: float) -> float:
    """The threshold tagging the share ``prior`` of the images: the cut nearest ``prior x N`` predictions."""
    distinct, _, n_pred = _cut_table(scores, np.zeros(len(scores), dtype=bool))
    wanted = prior * len(scores)
    if wanted < 0.5:
        return _clamp(0.5 * (float(distinct[0]) + 1.0))
    j = int(np.argmin(np.abs(n_pred - wanted)))
    return _threshold_below(distinct, j)


def _first_best(criterion: np.ndarray) -> int:
    """Index of the first (= highest-threshold) cut whose criterion is within 1e-12 relative of the maximum."""
    best = float(criterion.max())
    return int(np.flatnonzero(criterion >= best - _TIE_RTOL * abs(best))[0])


def _best_threshold(scores: np.ndarray, positives: np.ndarray, mode: CalibrationMode, prior: float = 0.0) -> float:
    """The threshold ``mode`` selects for one score vector (at least one positive); ``prior``: ``pu-f1``'s."""
    distinct, tp, n_pred = _cut_table(scores, positives)
    n_pos = float(tp[-1])
    if mode.kind == "f1":
        j = _first_best(2.0 * tp / (n_pred + n_pos))
    elif mode.kind == "pu":
        recall = tp / n_pos
        j = _first_best(recall * recall / (n_pred / len(scores)))
    elif mode.kind == "pu-f1":
        j = _first_best(2.0 * prior * (tp / n_pos) / (prior + n_pred / len(scores)))
    elif mode.kind == "recall":
        assert mode.value is not None
        # smallest number of positives whose fraction reaches R; the epsilon absorbs 0.14 * 50 = 7.000000000000001
        needed = max(1, math.ceil(mode.value * n_pos - 1e-9))
        j = int(np.searchsorted(tp, needed, side="left"))
    else:
        raise ValueError(f"mode {mode} has no per-class criterion")
    return _threshold_below(distinct, j)


def calibrate(probs: Any, labels: Any, mode: str | float | CalibrationMode = "f1", *,
              min_positives: int = DEFAULT_MIN_POSITIVES, expected_positives: float | None = None) -> Calibration:
    """Per-class thresholds from validation sigmoid ``probs`` and 0/1 ``labels`` (N, C); ``mode`` as for
    :func:`parse_mode`, a number, or a :class:`CalibrationMode`. ``pu`` maximises ``r^2 / P(yhat = 1)`` (Lee & Liu
    2003); ``pu-f1`` and ``rate`` use the prior ``pi_c`` from K (``mode``'s or ``expected_positives``, required). Raises
    ``ValueError`` on bad inputs, a bad mode, or ``min_positives < 1``."""
    if isinstance(mode, CalibrationMode):
        spec = mode
    elif isinstance(mode, int | float) and not isinstance(mode, bool):
        spec = parse_mode(repr(float(mode)))
    else:
        spec = parse_mode(mode)
    if isinstance(min_positives, bool) or not isinstance(min_positives, int | np.integer) or min_positives < 1:
        raise ValueError(f"min_positives must be an integer >= 1, got {min_positives!r}")
    p, y = _check_inputs(probs, labels)
    num_classes = p.shape[1]
    positives = [int(n) for n in y.sum(0)]

    if spec.kind == "threshold":
        assert spec.value is not None
        t = _clamp(spec.value)
        return Calibration(str(spec), [t] * num_classes, ["fixed"] * num_classes, positives, int(min_positives), None)
    priors = np.zeros(num_classes)
    pooled_prior = 0.0
    if spec.kind in ("rate", "pu-f1"):
        k = spec.value if spec.value is not None else expected_positives
        if k is None or not math.isfinite(k) or k <= 0:
            raise ValueError(f"{spec.kind} needs the expected number of positives per image K > 0: use "
                             f"{spec.kind}:K or pass expected_positives (an audit list, the run's k or an estimate)")
        spec = CalibrationMode(spec.kind, float(k))
    if spec.kind == "rate":
        shares = (np.asarray(positives, dtype=np.float64) + 1.0) / (sum(positives) + num_classes)
        rates = np.minimum(1.0, k * shares)
        thresholds = [_rate_threshold(p[:, c], float(rates[c])) for c in range(num_classes)]
        return Calibration(str(spec), thresholds, [str(spec)] * num_classes, positives, int(min_positives), None)
    if spec.kind == "pu-f1":
        total = max(sum(positives), 1)
        priors = np.minimum(1.0, k * np.asarray(positives, dtype=np.float64) / total)
        pooled_prior = min(1.0, k / num_classes)

    if y.any():
        fallback = _best_threshold(p.ravel(), y.ravel(), spec, pooled_prior)
        pooled_name = {"f1": "micro-f1", "pu": "pooled-pu", "pu-f1": "pooled-pu-f1",
                       "recall": f"pooled-{spec}"}[spec.kind]
        fallback_rule = f"fallback:{pooled_name}"
    else:
        fallback, fallback_rule = DEFAULT_THRESHOLD, f"fallback:{DEFAULT_THRESHOLD:g}"

    thresholds: list[float] = []
    rules: list[str] = []
    for c in range(num_classes):
        if positives[c] >= min_positives:
            thresholds.append(_best_threshold(p[:, c], y[:, c], spec, float(priors[c])))
            rules.append(str(spec))
        else:
            thresholds.append(fallback)
            rules.append(fallback_rule)
    return Calibration(str(spec), thresholds, rules, positives, int(min_positives), fallback)


def _per_class_prf(probs: np.ndarray, labels: np.ndarray, thresholds: np.ndarray) -> dict[str, np.ndarray]:
    """Per-class precision, recall, F1 in percent (0 without predictions or positives, as ``f1_scores``)."""
    pred = probs >= thresholds
    tp = (pred & labels).sum(0).astype(np.float64)
    n_pred = pred.sum(0).astype(np.float64)
    n_pos = labels.sum(0).astype(np.float64)
    precision = np.divide(tp, n_pred, out=np.zeros_like(tp), where=n_pred > 0)
    recall = np.divide(tp, n_pos, out=np.zeros_like(tp), where=n_pos > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(tp), where=total > 0)
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1}


def calibration_report(probs: Any, labels: Any, thresholds: Sequence[float] | np.ndarray, classes: Sequence[str], *,
                       mode: str | None = None, rules: Sequence[str] | None = None,
                       labels_name: str | None = None) -> dict[str, Any]:
    """Compare 0.5 with the calibrated ``thresholds`` against ``labels``: a JSON-serialisable dict with the overall
    metrics (:func:`models.evaluation.metrics.f1_scores`) and per-class precision / recall / F1 (percent) for both.
    ``labels_name`` says what the labels are."""
    p, y = _check_inputs(probs, labels)
    num_classes = p.shape[1]
    t = _check_thresholds(thresholds, num_classes)
    names = _check_names(classes, num_classes)
    if rules is not None and len(rules) != num_classes:
        raise ValueError(f"got {len(rules)} rules for {num_classes} classes")
    base = np.full(num_classes, DEFAULT_THRESHOLD)
    at_base, at_cal = _per_class_prf(p, y, base), _per_class_prf(p, y, t)
    positives = y.sum(0)
    per_class = []
    for c, name in enumerate(names):
        row: dict[str, Any] = {"class": name, "positives": int(positives[c]), "threshold": float(t[c])}
        if rules is not None:
            row["rule"] = str(rules[c])
        row["at_0.5"] = {k: float(v[c]) for k, v in at_base.items()}
        row["calibrated"] = {k: float(v[c]) for k, v in at_cal.items()}
        per_class.append(row)
    return {
        "mode": mode,
        "labels": labels_name,
        "num_images": int(p.shape[0]),
        "num_classes": int(num_classes),
        "overall": {"at_0.5": f1_scores(p, y, DEFAULT_THRESHOLD), "calibrated": f1_scores(p, y, t)},
        "per_class": per_class}


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _report_markdown(report: dict[str, Any]) -> str:
    lines = ["# Threshold calibration", ""]
    mode = report.get("mode")
    labels = report.get("labels")
    lines.append(
        f"{report['num_images']} images, {report['num_classes']} classes"
        + (f", mode `{mode}`" if mode else "")
        + (f", metrics against the {labels}" if labels else "")
        + ". Metrics in percent; a class is predicted when its probability is >= its threshold.")
    if labels and "single-positive" in labels:
        lines.append("Single-positive labels: every unobserved positive counts as a false positive, so precision "
                     "and F1 here are lower bounds; recall is measured on the observed positives.")
    lines += ["", "| thresholds | OP | OR | OF1 | CP | CR | CF1 |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key, label in (("at_0.5", "0.5 for every class"), ("calibrated", "calibrated")):
        m = report["overall"][key]
        lines.append(f"| {label} | " + " | ".join(f"{m[k]:.2f}" for k in ("OP", "OR", "OF1", "CP", "CR", "CF1")) + " |")
    has_rules = any("rule" in row for row in report["per_class"])
    head = "| class | positives | threshold |" + (" rule |" if has_rules else "")
    head += " P@0.5 | R@0.5 | F1@0.5 | P | R | F1 |"
    lines += ["", head, "|---|---:|---:|" + ("---|" if has_rules else "") + "---:|---:|---:|---:|---:|---:|"]
    for row in report["per_class"]:
        cells = [_md_cell(row["class"]), str(row["positives"]), f"{row['threshold']:.4f}"]
        if has_rules:
            cells.append(_md_cell(row.get("rule", "")))
        for key in ("at_0.5", "calibrated"):
            cells += [f"{row[key][k]:.2f}" for k in ("precision", "recall", "f1")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], path_md: str | Path, path_json: str | Path) -> None:
    """Write a :func:`calibration_report` dict as markdown (``path_md``) and JSON (``path_json``)."""
    md, js = Path(path_md), Path(path_json)
    for path in (md, js):
        path.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(_report_markdown(report), encoding="utf-8")
    js.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def plot_pr_curves(probs: Any, labels: Any, thresholds: Sequence[float] | np.ndarray, classes: Sequence[str],
                   path_png: str | Path) -> bool:
    """Draw a precision-recall panel per class into ``path_png``, marking the calibrated and the 0.5 points; False (and
    a message) when matplotlib is not installed."""
    p, y = _check_inputs(probs, labels)
    num_classes = p.shape[1]
    t = _check_thresholds(thresholds, num_classes)
    names = _check_names(classes, num_classes)
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"calibration: PR-curve plot {path_png} skipped: matplotlib is not installed (pip install matplotlib)",
              file=sys.stderr)
        return False

    ncols = min(num_classes, 5) if num_classes <= 25 else math.ceil(math.sqrt(num_classes))
    nrows = math.ceil(num_classes / ncols)
    fig = Figure(figsize=(2.4 * ncols, 2.3 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    for c in range(nrows * ncols):
        ax = axes[c // ncols][c % ncols]
        if c >= num_classes:
            ax.set_axis_off()
            continue
        ax.set_title(f"{names[c][:24]}  t={t[c]:.3f}", fontsize=8)
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.tick_params(labelsize=7)
        if c + ncols >= num_classes:  # lowest panel of its column: keep the recall tick labels (sharex hides them)
            ax.xaxis.set_tick_params(labelbottom=True)
        scores, pos = p[:, c], y[:, c]
        if not pos.any():
            ax.text(0.5, 0.5, "no positives", ha="center", va="center", fontsize=8, color="0.4")
            continue
        _, tp, n_pred = _cut_table(scores, pos)
        ax.plot(tp / tp[-1], tp / n_pred, lw=1, color="tab:blue")  # one vertex per distinct-score cut
        points = ((DEFAULT_THRESHOLD, "x", "0.3", "threshold 0.5"), (t[c], "o", "tab:red", "calibrated threshold t"))
        for thr, marker, colour, label in points:
            pred = scores >= thr
            n = int(pred.sum())
            hits = int((pred & pos).sum())
            ax.plot(hits / pos.sum(), hits / n if n else 0.0, marker, color=colour, ms=5, label=label)
    handles, legend_labels = axes[0][0].get_legend_handles_labels()
    if not handles:  # the first class had no positives: build the legend from any panel that has markers
        for ax in (a for row in axes for a in row):
            handles, legend_labels = ax.get_legend_handles_labels()
            if handles:
                break
    if handles:
        fig.legend(handles, legend_labels, loc="outside upper center", ncols=2, fontsize=8)
    fig.supxlabel("recall", fontsize=9)
    fig.supylabel("precision", fontsize=9)
    out = Path(path_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return True
