"""The summary of a tagging run (``python -m serve summary RUNFILE``): images per tag, tags per image and the classes
never predicted, as a table, Markdown and JSON reports and a bar plot (docs/tagging-at-scale.md)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.files.atomic_writes import atomic_path, atomic_write_text
from serve.outputs.records import iter_run_file

if TYPE_CHECKING:
    from serve.outputs.stage import TagSelector

#: Tags shown in the terminal table and the bar plot (the reports list every tag).
TOP_TAGS = 20


@dataclass
class RunSummary:
    """Counts of one run: images, images per tag, images per tag count, classes never predicted."""

    images: int
    per_tag: dict[str, int]
    tags_per_image: dict[int, int]
    never_predicted: list[str]
    classes: list[str] = field(default_factory=list)

    @property
    def mean_tags(self) -> float:
        """Mean number of tags per image (0 for an empty run)."""
        return sum(k * n for k, n in self.tags_per_image.items()) / self.images if self.images else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the JSON report)."""
        return {"images": self.images, "mean_tags_per_image": round(self.mean_tags, 4), "per_tag": self.per_tag,
                "tags_per_image": {str(k): v for k, v in self.tags_per_image.items()},
                "never_predicted": self.never_predicted, "classes": len(self.classes)}


def summarize(
    records: Iterable[Mapping[str, Any]],
    classes: Sequence[str] | None = None,
    chosen: Callable[[Mapping[str, float]], Sequence[str]] | None = None,
    names: Callable[[Sequence[str]], Sequence[str]] | None = None,
) -> RunSummary:
    """Count a run's ``records`` (streamed). ``classes`` default to the first record's; ``chosen`` (scores -> classes
    selected) decides which were never predicted (else by tag name), ``names`` maps them to the tags counted."""
    per_tag: Counter[str] = Counter()
    per_count: Counter[int] = Counter()
    predicted: set[str] = set()
    images = 0
    for rec in records:
        if classes is None:
            classes = list(rec.get("scores", {}))
        selected = list(chosen(rec["scores"])) if chosen is not None else None
        tags = list(names(selected)) if names is not None and selected is not None else list(rec["tags"])
        per_tag.update(dict.fromkeys(tags, 1))
        per_count[len(tags)] += 1
        predicted.update(selected if selected is not None else tags)
        images += 1
    classes = list(classes or [])
    return RunSummary(
        images=images,
        per_tag=dict(sorted(per_tag.items(), key=lambda kv: (-kv[1], kv[0]))),
        tags_per_image=dict(sorted(per_count.items())),
        never_predicted=[c for c in classes if c not in predicted],
        classes=classes)


def summarize_run_file(run_file: Path, separator: str, select: TagSelector | None = None) -> RunSummary:
    """:func:`summarize` of a run file's records, with ``select`` (from its manifest) per class."""
    if select is None:
        return summarize(iter_run_file(run_file, separator))
    return summarize(iter_run_file(run_file, separator), chosen=select.chosen, names=select.rules.labels)


def summary_table(summary: RunSummary, top: int = TOP_TAGS) -> str:
    """The short terminal table: totals, the ``top`` most frequent tags, the tags-per-image histogram."""
    lines = [f"{summary.images} images, {summary.mean_tags:.2f} tags per image, {len(summary.per_tag)} distinct "
             f"tags; {len(summary.never_predicted)} of {len(summary.classes)} classes never predicted"]
    width = max((len(t) for t in list(summary.per_tag)[:top]), default=3)
    for tag, count in list(summary.per_tag.items())[:top]:
        share = 100.0 * count / summary.images if summary.images else 0.0
        lines.append(f"  {tag:<{width}}  {count:>7}  {share:5.1f}%")
    if len(summary.per_tag) > top:
        lines.append(f"  ... {len(summary.per_tag) - top} more in the report")
    histogram = ", ".join(f"{k}: {n}" for k, n in summary.tags_per_image.items())
    lines.append(f"tags per image (count: images): {histogram or '-'}")
    if summary.never_predicted:
        shown = ", ".join(summary.never_predicted[:10])
        more = len(summary.never_predicted) - 10
        lines.append(f"never predicted: {shown}" + (f" ... (+{more})" if more > 0 else ""))
    return "\n".join(lines)


def summary_markdown(summary: RunSummary, title: str, plot_name: str | None) -> str:
    """The Markdown report: totals, every tag with its count, the histogram, the classes never predicted."""
    lines = [f"# Tagging summary: {title}", "", f"{summary.images} images, {summary.mean_tags:.2f} tags per image, "
             f"{len(summary.per_tag)} distinct tags.", ""]
    if plot_name:
        lines += [f"![images per tag]({plot_name})", ""]
    lines += ["## Images per tag", "", "| tag | images | share |", "|---|---:|---:|"]
    for tag, count in summary.per_tag.items():
        share = 100.0 * count / summary.images if summary.images else 0.0
        lines.append(f"| {tag.replace('|', '/')} | {count} | {share:.1f}% |")
    lines += ["", "## Tags per image", "", "| tags | images |", "|---:|---:|"]
    lines += [f"| {k} | {n} |" for k, n in summary.tags_per_image.items()]
    lines += ["", f"## Classes never predicted ({len(summary.never_predicted)} of {len(summary.classes)})", "",
              ", ".join(summary.never_predicted) or "none", ""]
    return "\n".join(lines)


def plot_tag_counts(summary: RunSummary, path: Path, top: int = TOP_TAGS) -> bool:
    """A horizontal bar plot of the ``top`` most frequent tags as PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    items = list(summary.per_tag.items())[:top][::-1]
    fig, ax = plt.subplots(figsize=(7, 0.3 * max(len(items), 3) + 1.2))
    ax.barh([t for t, _ in items], [n for _, n in items], color="#4C72B0")
    ax.set_xlabel("images")
    ax.set_title(f"images per tag (top {len(items)} of {len(summary.per_tag)})")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return True


def summary_paths(run_file: Path) -> tuple[Path, Path, Path]:
    """``tags.jsonl`` -> ``tags.summary.md``, ``tags.summary.json``, ``tags.summary.png``."""
    base = f"{run_file.stem}.summary"
    return (run_file.with_name(f"{base}.md"), run_file.with_name(f"{base}.json"),
            run_file.with_name(f"{base}.png"))


def write_summary_reports(summary: RunSummary, run_file: Path) -> list[Path]:
    """Write the Markdown and JSON reports (and the plot when matplotlib is there) beside ``run_file``."""
    md, js, png = summary_paths(run_file)
    plotted = plot_tag_counts(summary, png) if summary.per_tag else False
    atomic_write_text(md, summary_markdown(summary, run_file.name, png.name if plotted else None))
    atomic_write_text(js, json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n")
    return [md, js] + ([png] if plotted else [])
