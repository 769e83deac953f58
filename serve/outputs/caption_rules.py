"""Caption rules: how selected classes become tag text, applied in a fixed order (docs/tagging-at-scale.md, *Writing the
tags*), as flags, a rules file, demo fields or :class:`CaptionRules`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Rule names of a rules file (and the CLI flags without their dashes) that take a value.
VALUE_RULES = ("exclude", "exclude-re", "replace", "first")
#: Rule names that are switches.
SWITCH_RULES = ("spaces", "escape", "weights")
#: Tags this short keep their underscores under ``spaces`` (kaomoji such as ``^_^``).
KAOMOJI_MAX_LENGTH = 3
#: Decimals of a weighted tag, ``(tag:0.83)``.
WEIGHT_DECIMALS = 2


class CaptionRuleError(ValueError):
    """A caption rule that cannot be used; the message names the rule."""


@dataclass(frozen=True)
class CaptionRules:
    """A set of caption rules (see the module docstring); the default changes nothing."""

    exclude: tuple[str, ...] = ()
    exclude_re: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()
    first: tuple[str, ...] = ()
    spaces: bool = False
    escape: bool = False
    weights: bool = False
    _patterns: tuple[re.Pattern[str], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        patterns = []
        for pattern in self.exclude_re:
            try:
                patterns.append(re.compile(pattern))
            except re.error as exc:
                raise CaptionRuleError(f"caption rule 'exclude-re {pattern}': invalid regular expression ({exc})") \
                    from None
        object.__setattr__(self, "_patterns", tuple(patterns))
        for old, new in self.replace:
            if not old.strip() or not new.strip():
                raise CaptionRuleError(f"caption rule 'replace {old}={new}': both sides must be non-empty "
                                       "(to drop a tag use exclude)")
        for word in self.first:
            if not word.strip():
                raise CaptionRuleError("caption rule 'first': the word must not be empty")

    def check_classes(self, classes: Sequence[str]) -> None:
        """Raise :class:`CaptionRuleError` for a rule naming a class the model does not have."""
        known = set(classes)
        for name in self.exclude:
            if name not in known:
                raise CaptionRuleError(f"caption rule 'exclude {name}': {name!r} is not a class of this model")
        for old, new in self.replace:
            if old not in known:
                raise CaptionRuleError(f"caption rule 'replace {old}={new}': {old!r} is not a class of this model")

    def is_excluded(self, name: str) -> bool:
        """True when the class ``name`` is dropped by an ``exclude`` or ``exclude-re`` rule."""
        return name in self.exclude or any(p.search(name) for p in self._patterns)

    def _names(self, names: Sequence[str], scores: Sequence[float]) -> list[tuple[str, float]]:
        """Rules 1-3 (exclude, replace, spaces): ``(tag, score)`` of each class kept, in order."""
        renamed = dict(self.replace)
        out: list[tuple[str, float]] = []
        for name, score in zip(names, scores, strict=True):
            if self.is_excluded(name):
                continue
            tag = renamed.get(name, name)
            if self.spaces and len(tag) > KAOMOJI_MAX_LENGTH:
                tag = tag.replace("_", " ")
            out.append((tag, score))
        return out

    def labels(self, names: Sequence[str]) -> list[str]:
        """The tag folder names of selected classes: rules 1-3 only (exclude, replace, spaces), each once."""
        return list(dict.fromkeys(tag for tag, _ in self._names(names, [0.0] * len(names))))

    def apply(self, names: Sequence[str], scores: Sequence[float]) -> list[str]:
        """The tag texts of selected classes ``names`` (highest score first) with their ``scores``."""
        out: list[str] = []
        for tag, score in self._names(names, scores):
            if self.escape:
                tag = tag.replace("(", "\\(").replace(")", "\\)")
            if self.weights:
                tag = f"({tag}:{score:.{WEIGHT_DECIMALS}f})"
            out.append(tag)
        front = list(dict.fromkeys(self.first))
        return front + [t for t in dict.fromkeys(out) if t not in front]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (recorded with a run's outputs)."""
        return {"exclude": list(self.exclude), "exclude_re": list(self.exclude_re),
                "replace": {old: new for old, new in self.replace}, "first": list(self.first),
                "spaces": self.spaces, "escape": self.escape, "weights": self.weights}


def rules_from_dict(doc: dict[str, Any]) -> CaptionRules:
    """The :class:`CaptionRules` of :meth:`CaptionRules.to_dict` (:class:`CaptionRuleError` on a bad document)."""
    try:
        return CaptionRules(
            exclude=tuple(doc.get("exclude", ())), exclude_re=tuple(doc.get("exclude_re", ())),
            replace=tuple((str(k), str(v)) for k, v in dict(doc.get("replace", {})).items()),
            first=tuple(doc.get("first", ())), spaces=bool(doc.get("spaces")), escape=bool(doc.get("escape")),
            weights=bool(doc.get("weights")))
    except (TypeError, ValueError, AttributeError) as exc:
        raise CaptionRuleError(f"not a set of caption rules: {doc!r} ({exc})") from None


def parse_replacement(text: str) -> tuple[str, str]:
    """``OLD=NEW`` -> ``(OLD, NEW)`` (split at the first ``=``); :class:`CaptionRuleError` otherwise."""
    old, found, new = text.partition("=")
    if not found or not old.strip() or not new.strip():
        raise CaptionRuleError(f"caption rule 'replace {text}': use replace OLD=NEW")
    return old.strip(), new.strip()


def make_rules(
    exclude: Iterable[str] = (),
    exclude_re: Iterable[str] = (),
    replace: Iterable[str] = (),
    first: Iterable[str] = (),
    spaces: bool = False,
    escape: bool = False,
    weights: bool = False,
) -> CaptionRules:
    """Rules from flag-style values (``replace`` as ``OLD=NEW`` texts); :class:`CaptionRuleError` on a bad one."""
    return CaptionRules(
        exclude=tuple(e.strip() for e in exclude if e.strip()), exclude_re=tuple(exclude_re),
        replace=tuple(parse_replacement(r) for r in replace), first=tuple(w.strip() for w in first),
        spaces=spaces, escape=escape, weights=weights)


def parse_rules_text(text: str, source: str = "rules") -> CaptionRules:
    """Rules from the lines of a rules file (see the module docstring); errors name ``source:line``."""
    values: dict[str, list[str]] = {name: [] for name in VALUE_RULES}
    switches: dict[str, bool] = dict.fromkeys(SWITCH_RULES, False)
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        name, value = name.strip().lower().lstrip("-"), value.strip()
        if name in SWITCH_RULES and not value:
            switches[name] = True
        elif name in VALUE_RULES and value:
            values[name].append(value)
        else:
            known = ", ".join(f"{n} VALUE" for n in VALUE_RULES) + ", " + ", ".join(SWITCH_RULES)
            raise CaptionRuleError(f"{source}:{number}: caption rule {line!r} not understood (rules: {known})")
    try:
        return make_rules(values["exclude"], values["exclude-re"], values["replace"], values["first"],
                          **switches)
    except CaptionRuleError as exc:
        raise CaptionRuleError(f"{source}: {exc}") from None


def read_rules_file(path: str | Path) -> CaptionRules:
    """Rules from a rules file; :class:`CaptionRuleError` (bad rule) or ``OSError`` (unreadable file)."""
    return parse_rules_text(Path(path).read_text(encoding="utf-8"), str(path))


def combine(base: CaptionRules, extra: CaptionRules) -> CaptionRules:
    """``base`` (e.g. a rules file) with ``extra`` (e.g. flags) added: lists joined, switches or-ed."""
    return CaptionRules(
        exclude=base.exclude + extra.exclude, exclude_re=base.exclude_re + extra.exclude_re,
        replace=base.replace + extra.replace, first=base.first + extra.first,
        spaces=base.spaces or extra.spaces, escape=base.escape or extra.escape, weights=base.weights or extra.weights)
