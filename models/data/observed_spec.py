"""The ``--observed`` syntax (docs/datasets.md, "The protocol and its saved file"); ``auto`` is ``single`` on a
benchmark, ``all`` on the user's own data."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from models.data.spec_options import split_spec_options
from models.data.types import DataError

__all__ = ["SINGLE_VARIANTS", "VAL_LABELS", "ObservedSpec", "parse_observed"]

SINGLE_VARIANTS = ("uniform", "size", "location", "empirical")
_ALIASES = {"loc": "location", "semantic": "empirical"}  # the reference's --bias-type names
VAL_LABELS = ("clean", "observed")
_USAGE = ("use auto, single[:uniform|size|location|empirical][?pos=N&neg=M&weights=FILE&val=clean|observed], all, "
          "partial:R[?val=...] with 0 < R <= 1, or an existing protocol FILE (a run's observed.npz, or a "
          "formatted_train_labels_obs.npy)")


@dataclass(frozen=True)
class ObservedSpec:
    """How labels are observed: the ``kind`` with its settings, and the ``val`` labels (``clean`` or ``observed``)."""

    kind: str
    rate: float = 1.0
    path: str = ""
    variant: str = "uniform"
    num_pos: int = 1
    num_neg: int = 0
    weights: str = ""
    val: str = "clean"

    @property
    def is_published(self) -> bool:
        """True for the published setting: one uniform positive, no negative."""
        return (self.kind, self.variant, self.num_pos, self.num_neg) == ("single", "uniform", 1, 0)

    def options(self) -> str:
        """The non-default options as ``?key=value&...`` (empty when there are none)."""
        count = {-1: "all"}
        pairs = [("pos", count.get(self.num_pos, str(self.num_pos)), self.num_pos != 1),
                 ("neg", count.get(self.num_neg, str(self.num_neg)), self.num_neg != 0),
                 ("weights", self.weights, bool(self.weights)), ("val", self.val, self.val != "clean")]
        text = "&".join(f"{key}={value}" for key, value, shown in pairs if shown)
        return f"?{text}" if text else ""

    def argument(self) -> str:
        """The ``--observed`` value that gives this spec (files and weights as absolute paths)."""
        if self.kind == "single":
            head = "single" if self.variant == "uniform" else f"single:{self.variant}"
        elif self.kind == "partial":
            head = f"partial:{self.rate:g}"
        elif self.kind == "given":
            head = f"given:{self.path}"
        else:
            head = self.path if self.kind == "file" else self.kind
        return head + self.options()

    def __str__(self) -> str:
        return self.argument()


def _count(text: str, key: str, original: str) -> int:
    """``pos`` / ``neg`` value: a non-negative integer or ``all`` (-1)."""
    if text == "all":
        return -1
    if text.isdigit():
        return int(text)
    raise ValueError(f"invalid --observed {original!r}: {key}= takes a number >= 0 or 'all', got {text!r}")


def _with_options(spec: ObservedSpec, options: dict[str, str], original: str, check_files: bool) -> ObservedSpec:
    """``spec`` with its parsed options applied and checked (``check_files``: the weights file exists)."""
    val = options.get("val", "clean") or "clean"
    if val not in VAL_LABELS:
        raise ValueError(f"invalid --observed {original!r}: val= takes clean or observed, got {val!r}")
    spec = replace(spec, val=val)
    if spec.kind == "all" and val == "observed":
        raise ValueError(f"invalid --observed {original!r}: all observes every label, so its val labels are the "
                         "clean ones; for the reference's clean-training oracle selected on single-positive val "
                         "labels use --method bce --observed 'single?val=observed'")
    if spec.kind != "single":
        extra = sorted(set(options) - {"val"})
        if extra:
            raise ValueError(f"invalid --observed {original!r}: {', '.join(extra)} apply to single only")
        return spec
    if spec.variant == "uniform":
        spec = replace(spec, num_pos=_count(options.get("pos", "1"), "pos", original),
                       num_neg=_count(options.get("neg", "0"), "neg", original))
    elif "pos" in options or "neg" in options:
        raise ValueError(f"invalid --observed {original!r}: pos= and neg= apply to single:uniform only (the "
                         "label-bias variants keep one positive and no negative, as the reference does)")
    if spec.variant == "empirical":
        weights = options.get("weights", "")
        if not weights or (check_files and not Path(weights).expanduser().is_file()):
            raise ValueError(f"invalid --observed {original!r}: single:empirical needs weights=FILE, an existing "
                             "file of per-class weights (JSON {\"class\": weight} or 'class weight' lines)")
        spec = replace(spec, weights=str(Path(weights).expanduser().resolve()) if check_files else weights)
    elif "weights" in options:
        raise ValueError(f"invalid --observed {original!r}: weights= applies to single:empirical only")
    return spec


def parse_observed(text: str, check_files: bool = True) -> ObservedSpec:
    """An ``--observed`` value as an :class:`ObservedSpec` (``ValueError`` listing the forms)."""
    stripped = text.strip()
    if Path(stripped).expanduser().is_file():
        return ObservedSpec("file", path=str(Path(stripped).expanduser().resolve()))
    head, _, query = stripped.partition("?")
    kind, _, argument = head.partition(":")
    try:
        _, options = split_spec_options(f"?{query}", ("pos", "neg", "weights", "val"), "--observed")
    except DataError as exc:
        raise ValueError(f"invalid --observed {text!r}: {str(exc).split(': ', 1)[-1]}") from None
    if Path(head).expanduser().is_file():
        if Path(head).suffix != ".npy" and query:
            raise ValueError(f"invalid --observed {text!r}: a protocol file fixes its own validation labels; "
                             "options apply to a .npy matrix only")
        spec = ObservedSpec("file", path=str(Path(head).expanduser().resolve()))
        return _with_options(spec, options, text, check_files)
    kind = kind.lower()
    if kind == "single":
        variant = _ALIASES.get(argument.lower(), argument.lower()) or "uniform"
        if variant not in SINGLE_VARIANTS:
            raise ValueError(f"invalid --observed {text!r}: unknown variant {argument!r} (single:"
                             f"{'|'.join(SINGLE_VARIANTS)})")
        return _with_options(ObservedSpec("single", variant=variant), options, text, check_files)
    if kind in ("all", "full") and not argument:
        return _with_options(ObservedSpec("all"), options, text, check_files)
    if kind == "auto" and not argument:
        return _with_options(ObservedSpec("auto"), options, text, check_files)
    if kind == "partial":
        try:
            rate = float(argument)
        except ValueError:
            rate = -1.0
        if 0.0 < rate <= 1.0:
            return _with_options(ObservedSpec("partial", rate), options, text, check_files)
        raise ValueError(f"invalid --observed {text!r}: use partial:R with 0 < R <= 1")
    raise ValueError(f"invalid --observed {text!r}: {_USAGE}")
