"""The ``--observed`` syntax: how the training labels (and optionally the validation labels) are observed.

    auto                               (the default: single on a benchmark, all on your own data)
    single[:uniform|size|location|empirical][?pos=N&neg=M&weights=FILE&val=clean|observed]
    all                                (every label the data gives; "full" is accepted for it)
    partial:R[?val=clean|observed]
    FILE[?val=clean|observed]          (a .npy matrix; a run's observed.npz carries its own val labels)

``auto`` is resolved once the dataset is loaded (models/data/protocol.py, :func:`resolve_observed`): a benchmark
whose loader declares its training labels complete gets the papers' ``single``; a user's own data (``csv:``,
``folder:``) gets ``all``: its labels, one or several per image as someone gave them, are the observed labels, and
nothing is drawn unless asked with ``single``.

Options use the dataset specs' syntax (models/data/spec_options.py). ``single`` alone is what every published run
uses: one positive per image drawn uniformly, no negative (the seeds' ``generate_observed_labels.py`` defaults).
``pos`` / ``neg`` are that script's ``--num-pos`` / ``--num-neg`` (``all`` = its -1); ``size``, ``location`` and
``empirical`` are the label-bias variants of its ``spml-bias`` branch (``loc`` and ``semantic`` are accepted as
its names for the last two); ``empirical`` takes its per-class weights from ``weights=FILE``. ``val=observed``
scores the validation split with its observed positives instead of its clean labels (the reference's
``val_set_variant='observed'``).
"""

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
    """How labels are observed.

    ``kind``: ``auto`` (resolved with the dataset), ``single`` (``variant`` draws the kept positive; ``num_pos`` /
    ``num_neg`` positives / negatives per image for ``uniform``, -1 = all; ``weights`` the class-weights file of
    ``empirical``), ``all`` (every label as given; on a benchmark, the clean-training oracle),
    ``partial`` (each positive kept with probability ``rate``), ``file`` (read from ``path``: a protocol file or
    a pool-aligned .npy) or ``given`` (shipped with the data; ``path`` names the file). ``val``: ``clean`` or
    ``observed`` validation labels.
    """

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
        """True for the published setting (``single``: one uniform positive, no negative), the one the seeds'
        distributed ``formatted_train_labels_obs.npy`` files hold."""
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
    """``spec`` with the parsed spec options applied and checked against its kind and variant (and, with
    ``check_files``, the weights file's existence)."""
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
    """Parse an ``--observed`` value (see the module docstring) into an :class:`ObservedSpec`; a bad value raises
    ``ValueError`` with the accepted forms. ``check_files=False`` (a value read back from a protocol file) takes
    a weights path as it is, existing or not."""
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
