"""Tag every image in a folder tree with a trained model: a run file (JSONL or CSV) and optional sidecars.

Pipeline: scan the folder (sorted, recursive, case-insensitive extensions; symlinked files are followed,
symlinked folders are not, so a link loop cannot recurse) -> decide per image under the ``existing`` policy
(skip = resume, overwrite, append) -> decode + preprocess in a thread pool (:func:`serve.predictor.load_rgb`
with its pixel-count check, then :class:`~models.preprocess.EvalTransform` from the model's metadata), a
bounded window ahead of the model so decoding overlaps inference -> batches through the runtime -> sigmoid
-> per-class thresholds (:func:`serve.predictor.resolve_thresholds`) -> one sidecar text file per image
(written atomically as each batch finishes) and the run file (written atomically at the end).

Run file line (JSONL): ``{"path": "sub/a.jpg", "scores": {class: p, ...}, "tags": [class, ...]}`` with
``path`` relative to the folder (POSIX separators), every class's probability rounded to 6 decimals, and the
tags being the classes whose (rounded) probability is >= their threshold, highest score first (at most
``top_k``). CSV: columns ``path, tags, <one per class>``, tags joined with the sidecar separator.
Images that cannot be used go to the errors file (``path<TAB>reason``), never into the run file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from models.atomic_files import atomic_path, atomic_write_text
from models.checkpoint import ModelMeta
from models.preprocess import IMAGE_EXTENSIONS
from serve import DEFAULT_BATCH_SIZE, DEFAULT_OUTPUT, DEFAULT_THRESHOLD
from serve.runtimes import Runtime

if TYPE_CHECKING:  # serve.predictor imports this module: import it lazily at run time
    from serve.predictor import Predictor

#: Largest image accepted (width x height), checked from the header before decoding: Pillow's own limit.
DEFAULT_MAX_PIXELS = 89_478_485
#: What to do with images whose outputs exist already (see :func:`tag_folder`).
EXISTING_POLICIES = ("skip", "overwrite", "append")
DEFAULT_EXISTING = "skip"
DEFAULT_SIDECAR_EXT = ".txt"
DEFAULT_SEPARATOR = ", "


def default_workers() -> int:
    """Decode threads used when none are given: the CPU count, capped at 8."""
    return max(1, min(8, os.cpu_count() or 1))


# --------------------------------------------------------------------------------------------------------
# Discovery


def scan_folder(folder: str | Path, errors: list[tuple[str, str]] | None = None) -> tuple[list[Path], int]:
    """Walk ``folder`` recursively: symlinked files are listed, symlinked folders are not entered (no loops).

    Returns (files whose suffix is in IMAGE_EXTENSIONS, case-insensitive, sorted by their relative POSIX
    path; number of other files, which are ignored). Folders that cannot be listed are appended to ``errors``
    as (relative path, reason) when it is given.
    """
    folder = Path(folder)
    images: list[Path] = []
    other = 0

    def on_error(exc: OSError) -> None:
        if errors is not None:
            where = Path(exc.filename or folder)
            rel = where.relative_to(folder).as_posix() if where.is_relative_to(folder) else str(where)
            errors.append((rel + "/", f"folder cannot be listed ({exc.strerror or exc})"))

    for root, dirs, files in os.walk(folder, followlinks=False, onerror=on_error):
        dirs.sort()
        for name in files:
            if Path(name).suffix.lower() in IMAGE_EXTENSIONS:
                images.append(Path(root) / name)
            else:
                other += 1
    images.sort(key=lambda p: p.relative_to(folder).as_posix())
    return images, other


def find_images(folder: str | Path) -> list[Path]:
    """The image files under ``folder`` in tagging order (see :func:`scan_folder`)."""
    return scan_folder(folder)[0]


# --------------------------------------------------------------------------------------------------------
# Scores, thresholds, records


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def class_thresholds(meta: ModelMeta, threshold: float | None = None) -> np.ndarray:
    """Per-class thresholds ``(C,)``: ``threshold`` for all if given, else ``meta.thresholds``, else 0.5.

    The base of :func:`serve.predictor.resolve_thresholds`, which adds per-class overrides; use that one.
    """
    n = len(meta.classes)
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        return np.full(n, float(threshold))
    if meta.thresholds is not None:
        if len(meta.thresholds) != n:
            raise ValueError(f"model metadata has {len(meta.thresholds)} thresholds for {n} classes")
        return np.asarray(meta.thresholds, dtype=np.float64)
    return np.full(n, DEFAULT_THRESHOLD)


def read_thresholds_file(path: str | Path) -> dict[str, float]:
    """Per-class thresholds from a file: a JSON object ``{class: threshold}``, or lines ``class<TAB>threshold``
    / ``class,threshold`` (blank lines and ``#`` comments ignored). Raises ``ValueError`` / ``OSError``."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        return {str(k): _threshold_value(path, str(k), v) for k, v in doc.items()}
    out: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sep = "\t" if "\t" in line else ","
        name, found, value = line.rpartition(sep)
        if not found or not name.strip():
            raise ValueError(f"{path}:{number}: expected 'class<TAB>threshold' or 'class,threshold', got {line!r}")
        out[name.strip()] = _threshold_value(path, name.strip(), value.strip())
    return out


def _threshold_value(path: str | Path, name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: threshold of {name!r} is not a number: {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{path}: threshold of {name!r} must be in [0, 1], got {number}")
    return number


def thresholds_source(meta: ModelMeta, threshold: float | None, per_class: Mapping[str, float] | None) -> str:
    """Human description of where the thresholds come from, for the start-up line."""
    if threshold is not None:
        base = f"global {threshold:g}"
    elif meta.thresholds is not None:
        base = "the model's calibrated per-class thresholds"
    else:
        base = f"{DEFAULT_THRESHOLD:g} (the model has no calibrated thresholds)"
    return base + (f", {len(per_class)} class(es) overridden from file" if per_class else "")


def tag_record(
    rel_path: str, probs: np.ndarray, classes: list[str], thresholds: np.ndarray, top_k: int | None = None
) -> dict[str, Any]:
    """One output record from a probability row ``(C,)``: rounded scores of all classes + tags (at most
    ``top_k`` of them, highest first, when given)."""
    rounded = [round(float(p), 6) for p in probs]
    chosen = [i for i, p in enumerate(rounded) if p >= thresholds[i]]
    chosen.sort(key=lambda i: (-rounded[i], i))
    if top_k is not None:
        chosen = chosen[:top_k]
    return {
        "path": rel_path,
        "scores": {c: p for c, p in zip(classes, rounded, strict=True)},
        "tags": [classes[i] for i in chosen],
    }


# --------------------------------------------------------------------------------------------------------
# Sidecars


@dataclass(frozen=True)
class SidecarSpec:
    """Sidecar text files: ``ext`` (with its dot), tag ``separator``, and ``folder`` (``None``: next to each
    image; else a tree mirroring the input folder's)."""

    ext: str = DEFAULT_SIDECAR_EXT
    separator: str = DEFAULT_SEPARATOR
    folder: Path | None = None

    def __post_init__(self) -> None:
        if not self.ext.startswith(".") or len(self.ext) < 2 or "/" in self.ext or os.sep in self.ext:
            raise ValueError(f"sidecar extension must look like .txt, got {self.ext!r}")
        if self.ext.lower() in IMAGE_EXTENSIONS:
            raise ValueError(f"sidecar extension {self.ext} is an image extension: it would overwrite images")
        if not self.separator:
            raise ValueError("the tag separator must not be empty")


def sidecar_paths(folder: Path, images: Sequence[Path], spec: SidecarSpec) -> dict[Path, Path]:
    """Sidecar file of each image: ``a.jpg`` -> ``a.txt`` (under ``spec.folder`` if set, mirroring the tree).
    Images whose names would share a sidecar (``a.jpg`` and ``a.png``) keep their suffix: ``a.jpg.txt``."""
    base = spec.folder if spec.folder is not None else folder

    def short(image: Path) -> Path:
        return base / image.relative_to(folder).with_suffix(spec.ext)

    counts = Counter(short(p) for p in images)
    return {
        p: short(p) if counts[short(p)] == 1 else base / image_rel_with_ext(folder, p, spec.ext) for p in images
    }


def image_rel_with_ext(folder: Path, image: Path, ext: str) -> Path:
    """``sub/a.jpg`` -> ``sub/a.jpg<ext>``: the sidecar name used when stems collide."""
    rel = image.relative_to(folder)
    return rel.with_name(rel.name + ext)


def split_tags(text: str, separator: str) -> list[str]:
    """Tags of a sidecar's text (split on the separator, surrounding whitespace dropped, empties removed)."""
    sep = separator.strip() or separator
    return [t.strip() for t in text.replace("\r\n", "\n").split(sep) if t.strip()]


def merge_tags(existing: Sequence[str], new: Sequence[str]) -> list[str]:
    """``existing`` followed by the tags of ``new`` not already in it (each tag once)."""
    out = list(dict.fromkeys(existing))
    out.extend(t for t in new if t not in out)
    return out


def write_sidecar(path: Path, tags: Sequence[str], spec: SidecarSpec, append: bool) -> None:
    """Write the tags to ``path`` atomically; with ``append``, after the tags already there (no duplicates)."""
    if append and path.is_file():
        tags = merge_tags(split_tags(path.read_text(encoding="utf-8"), spec.separator), tags)
    atomic_write_text(path, spec.separator.join(tags) + "\n")


# --------------------------------------------------------------------------------------------------------
# The run file and the errors file


class OutputConflictError(ValueError):
    """An existing output cannot be reused as asked (e.g. the run file was written for other classes)."""


def is_csv(path: str | Path) -> bool:
    """True when the run file is CSV (its name ends in .csv), else it is JSON Lines."""
    return Path(path).suffix.lower() == ".csv"


def read_run_file(path: Path, separator: str = DEFAULT_SEPARATOR) -> dict[str, dict[str, Any]]:
    """Records of an existing run file (JSONL or CSV) by relative path; ``{}`` when it does not exist.
    Raises :class:`OutputConflictError` when it cannot be parsed."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    try:
        return _read_csv(text, separator) if is_csv(path) else _read_jsonl(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise OutputConflictError(f"cannot read the existing run file {path}: {exc}") from None


def _read_jsonl(text: str) -> dict[str, dict[str, Any]]:
    records = {}
    for line in text.splitlines():
        if line.strip():
            rec = json.loads(line)
            if "scores" in rec:
                records[str(rec["path"])] = {"path": rec["path"], "scores": rec["scores"], "tags": list(rec["tags"])}
    return records


def _read_csv(text: str, separator: str) -> dict[str, dict[str, Any]]:
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        return {}
    header, body = rows[0], rows[1:]
    if header[:2] != ["path", "tags"]:
        raise ValueError(f"expected columns path, tags, <classes>; got {', '.join(header[:3])}")
    classes = header[2:]
    return {
        row[0]: {
            "path": row[0],
            "scores": {c: float(v) for c, v in zip(classes, row[2:], strict=True)},
            "tags": split_tags(row[1], separator),
        }
        for row in body
    }


def write_run_file(path: Path, records: Iterable[dict[str, Any]], classes: Sequence[str], separator: str) -> None:
    """Write records (sorted by path) to ``path`` atomically as CSV or JSONL (see the module docstring)."""
    ordered = sorted(records, key=lambda r: r["path"])
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        if is_csv(path):
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["path", "tags", *classes])
            for rec in ordered:
                writer.writerow([rec["path"], separator.join(rec["tags"]), *(rec["scores"][c] for c in classes)])
        else:
            for rec in ordered:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def default_errors_path(output: str | Path) -> Path:
    """``out/tags.jsonl`` -> ``out/tags.errors.tsv``."""
    output = Path(output)
    return output.with_name(output.stem + ".errors.tsv")


def write_errors(path: Path, failed: Sequence[tuple[str, str]]) -> None:
    """Write ``path<TAB>reason`` lines atomically (tabs and newlines inside a field become spaces)."""

    def clean(text: str) -> str:
        return " ".join(text.replace("\t", " ").splitlines())

    atomic_write_text(path, "".join(f"{clean(p)}\t{clean(r)}\n" for p, r in failed))


# --------------------------------------------------------------------------------------------------------
# Planning: what to tag, what is done


@dataclass
class TagPlan:
    """The images to tag and those skipped as already done, decided before any model is loaded."""

    folder: Path
    todo: list[Path]
    done: list[Path]
    ignored: int
    previous: dict[str, dict[str, Any]]  # records of the existing run file, by relative path
    sidecars: dict[Path, Path]  # image -> sidecar file ({} without sidecars)
    scan_errors: list[tuple[str, str]] = field(default_factory=list)

    def rel(self, path: Path) -> str:
        """Relative POSIX path of an image, as written to the outputs."""
        return path.relative_to(self.folder).as_posix()


def plan_tagging(
    folder: str | Path,
    output: str | Path,
    existing: str = DEFAULT_EXISTING,
    sidecar: SidecarSpec | None = None,
) -> TagPlan:
    """Scan ``folder`` and split its images into to-do and done under the ``existing`` policy: with ``skip``,
    an image is done when its sidecar exists (with sidecars) or its path is in the existing run file
    (without). Reads the existing run file, whose records of skipped images are kept."""
    if existing not in EXISTING_POLICIES:
        raise ValueError(f"existing must be one of {', '.join(EXISTING_POLICIES)}, got {existing!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"folder not found: {folder}")
    scan_errors: list[tuple[str, str]] = []
    paths, ignored = scan_folder(folder, scan_errors)
    separator = sidecar.separator if sidecar is not None else DEFAULT_SEPARATOR
    previous = read_run_file(Path(output), separator) if existing == "skip" else {}
    sidecars = sidecar_paths(folder, paths, sidecar) if sidecar is not None else {}
    plan = TagPlan(folder, [], [], ignored, previous, sidecars, scan_errors)
    for path in paths:
        done = sidecars[path].is_file() if sidecar is not None else plan.rel(path) in previous
        (plan.done if existing == "skip" and done else plan.todo).append(path)
    return plan


# --------------------------------------------------------------------------------------------------------
# Decoding ahead of the model


def _decode(transform: Callable[[Path], Any], path: Path) -> tuple[np.ndarray | None, str | None]:
    """``(model input, None)`` or ``(None, reason)``; one bad file must not stop the run."""
    from serve.predictor import ImageError

    try:
        if path.stat().st_size == 0:
            return None, "empty file (0 bytes)"
        if not os.access(path, os.R_OK):
            return None, "permission denied"
        out = transform(path)
        return (out.numpy() if hasattr(out, "numpy") else np.asarray(out)), None
    except ImageError as exc:
        return None, exc.reason
    except FileNotFoundError:
        return None, "file not found (a broken symlink, or deleted during the run)"
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        return None, f"{type(exc).__name__}: {exc}"


def decode_ahead(
    paths: Iterable[Path], transform: Callable[[Path], Any], workers: int, window: int
) -> Iterator[tuple[Path, np.ndarray | None, str | None]]:
    """Yield ``(path, array or None, error or None)`` in input order, decoding up to ``window`` files ahead
    in ``workers`` threads (so decoding continues while the caller runs the model). ``transform`` maps a
    path to the model input (an array or a tensor)."""
    it = iter(paths)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="decode")
    pending: deque[tuple[Path, Future[tuple[np.ndarray | None, str | None]]]] = deque()
    try:
        for path in it:
            pending.append((path, pool.submit(_decode, transform, path)))
            if len(pending) >= window:
                break
        while pending:
            path, fut = pending.popleft()
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(_decode, transform, nxt)))
            array, error = fut.result()
            yield path, array, error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------------------------------------
# Tagging


@dataclass
class TagSummary:
    """Result of :func:`tag_folder`."""

    folder: Path
    output: Path
    tagged: int
    failed: list[tuple[str, str]] = field(default_factory=list)  # (relative path, reason)
    ignored: int = 0  # files without an image extension
    seconds: float = 0.0
    skipped: int = 0  # already done under --existing skip
    errors_file: Path | None = None  # where the failures were listed

    @property
    def ok(self) -> bool:
        """True when every image file was tagged (now or, under ``skip``, before)."""
        return not self.failed and self.tagged + self.skipped > 0

    def line(self) -> str:
        """One-line human summary."""
        rate = self.tagged / self.seconds if self.seconds > 0 else 0.0
        parts = [f"tagged {self.tagged} images in {self.seconds:.1f} s ({rate:.1f} img/s) -> {self.output}"]
        if self.skipped:
            parts.append(f"{self.skipped} already done (skipped; --existing overwrite redoes them)")
        if self.failed:
            parts.append(f"{len(self.failed)} failed (listed in {self.errors_file})")
        if self.ignored:
            parts.append(f"{self.ignored} non-image files ignored")
        return "; ".join(parts)


def as_predictor(
    model: Predictor | Runtime | str | Path, device: str | None = None, max_pixels: int | None = None
) -> Predictor:
    """A :class:`~serve.predictor.Predictor` from a loaded one, a runtime, or a model path (loaded on ``device``).
    Raises ``ValueError`` when the model does not output logits."""
    from serve.predictor import Predictor

    if isinstance(model, Predictor):
        return model
    if isinstance(model, (str, Path)):
        return Predictor.load(model, device=device, max_pixels=max_pixels)
    if model.meta.output != "logits":
        raise ValueError(f"model output is {model.meta.output!r}; the tagger expects logits")
    return Predictor(model, path=getattr(model, "path", None), max_pixels=max_pixels)


def _check_previous(plan: TagPlan, classes: list[str], output: Path) -> None:
    for path in plan.done:
        rec = plan.previous.get(plan.rel(path))
        if rec is not None and list(rec["scores"]) != classes:
            raise OutputConflictError(
                f"{output} was written by a model with other classes; use --existing overwrite or another --output"
            )


def tag_folder(
    folder: str | Path,
    model: Predictor | Runtime | str | Path,
    output: str | Path = DEFAULT_OUTPUT,
    *,
    threshold: float | None = None,
    per_class: Mapping[str, float] | None = None,
    top_k: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int | None = None,
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    existing: str = DEFAULT_EXISTING,
    sidecar: SidecarSpec | None = None,
    errors: str | Path | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    device: str | None = None,
) -> TagSummary:
    """Tag every image under ``folder`` with ``model`` (a Predictor, a loaded runtime, or a model path).

    Writes the run file ``output`` (CSV when it ends in .csv, else JSONL) atomically at the end, and with
    ``sidecar`` one text file per image as each batch finishes (atomic too). ``existing``: ``skip`` leaves
    images already done (see :func:`plan_tagging`) and keeps their run-file records, ``overwrite`` redoes
    everything, ``append`` redoes everything and adds new tags to existing sidecars without duplicates.
    Thresholds: :func:`serve.predictor.resolve_thresholds` (``threshold``, then ``per_class``). Images that
    cannot be used (unreadable, empty, not an image, over ``max_pixels``) are reported through ``warn``
    (default: stderr) and listed in ``errors`` (default: :func:`default_errors_path`), never tagged.
    Raises ``FileNotFoundError`` (no folder), ``ValueError`` (bad option, model output not logits,
    :class:`OutputConflictError`) and whatever the runtime raises. Without image files nothing is written.
    """
    start = time.perf_counter()
    if batch_size < 1:
        raise ValueError("batch size must be >= 1")
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be >= 1")
    output = Path(output)
    plan = plan_tagging(folder, output, existing, sidecar)
    predictor = as_predictor(model, device, max_pixels)
    from serve.predictor import load_rgb, resolve_thresholds

    classes = list(predictor.classes)
    thresholds = resolve_thresholds(predictor.meta, threshold, per_class)
    _check_previous(plan, classes, output)
    summary = TagSummary(plan.folder, output, 0, list(plan.scan_errors), plan.ignored, skipped=len(plan.done))
    summary.errors_file = Path(errors) if errors is not None else default_errors_path(output)
    if not plan.todo and not plan.done:
        summary.seconds = time.perf_counter() - start
        return summary

    report = warn or (lambda msg: tqdm.write(msg, file=sys.stderr))
    for rel, reason in plan.scan_errors:
        report(f"skipped {rel}: {reason}")
    records = {plan.rel(p): plan.previous[plan.rel(p)] for p in plan.done if plan.rel(p) in plan.previous}
    bar = tqdm(total=len(plan.todo), unit="img", file=sys.stderr, disable=not progress, dynamic_ncols=True)

    def transform(path: Path) -> Any:
        return predictor.transform(load_rgb(path, max_pixels, predictor.transform.decode_side))

    def flush(batch_paths: list[Path], arrays: list[np.ndarray]) -> None:
        probs = predictor.scores_from_inputs(np.stack(arrays))
        for path, row in zip(batch_paths, probs, strict=True):
            rec = tag_record(plan.rel(path), row, classes, thresholds, top_k)
            records[rec["path"]] = rec
            if sidecar is not None:
                write_sidecar(plan.sidecars[path], rec["tags"], sidecar, append=existing == "append")
        summary.tagged += len(arrays)
        bar.update(len(arrays))

    try:
        n_workers = workers if workers is not None else default_workers()
        window = max(2 * batch_size, 4 * n_workers)
        batch_paths: list[Path] = []
        arrays: list[np.ndarray] = []
        for path, array, error in decode_ahead(plan.todo, transform, n_workers, window):
            if array is None:
                summary.failed.append((plan.rel(path), error or "unknown error"))
                report(f"skipped {plan.rel(path)}: {error}")
                bar.update(1)
                continue
            batch_paths.append(path)
            arrays.append(array)
            if len(arrays) == batch_size:
                flush(batch_paths, arrays)
                batch_paths, arrays = [], []
        if arrays:
            flush(batch_paths, arrays)
    finally:
        bar.close()
    write_run_file(output, records.values(), classes, sidecar.separator if sidecar else DEFAULT_SEPARATOR)
    if summary.failed or summary.errors_file.exists():
        write_errors(summary.errors_file, summary.failed)
    summary.seconds = time.perf_counter() - start
    return summary
