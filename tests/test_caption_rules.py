"""Caption rules: each rule on known tags, rule files, and usage errors that name the rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.outputs.caption_rules import (
    CaptionRuleError,
    CaptionRules,
    combine,
    make_rules,
    parse_rules_text,
    read_rules_file,
)

NAMES = ["long_hair", "rating_safe", "^_^", "hat_(object)", "cat"]
SCORES = [0.97, 0.9, 0.8, 0.7, 0.612]


def test_no_rules_change_nothing() -> None:
    assert CaptionRules().apply(NAMES, SCORES) == NAMES


def test_each_rule() -> None:
    assert make_rules(exclude=["cat"]).apply(NAMES, SCORES) == NAMES[:4]
    assert make_rules(exclude_re=["^rating_"]).apply(NAMES, SCORES) == ["long_hair", "^_^", "hat_(object)", "cat"]
    assert make_rules(replace=["cat=kitty"]).apply(NAMES, SCORES)[-1] == "kitty"
    assert make_rules(spaces=True).apply(NAMES, SCORES) == ["long hair", "rating safe", "^_^", "hat (object)", "cat"]
    assert make_rules(escape=True).apply(NAMES, SCORES)[3] == "hat_\\(object\\)"
    assert make_rules(weights=True).apply(["cat"], [0.612]) == ["(cat:0.61)"]
    assert make_rules(first=["sks", "cat"]).apply(NAMES, SCORES) == ["sks", "cat", *NAMES[:4]]


def test_rules_combine_in_order() -> None:
    rules = make_rules(exclude_re=["^rating"], replace=["long_hair=long_(hair)"], spaces=True, escape=True,
                       weights=True, first=["mytrigger"])
    assert rules.apply(NAMES, SCORES) == ["mytrigger", "(long \\(hair\\):0.97)", "(^_^:0.80)",
                                          "(hat \\(object\\):0.70)", "(cat:0.61)"]


def test_two_classes_replaced_by_one_word_give_one_tag() -> None:
    assert make_rules(replace=["cat=animal", "^_^=animal"]).apply(NAMES, SCORES)[2:] == ["animal", "hat_(object)"]


def test_rules_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "rules.txt"
    path.write_text("# dataset captions\nfirst sks\nexclude-re ^rating_\nreplace cat=kitty\n--spaces\n\nexclude ^_^\n")
    rules = read_rules_file(path)
    assert rules.apply(NAMES, SCORES) == ["sks", "long hair", "hat (object)", "kitty"]
    flags = make_rules(escape=True, first=["extra"])
    assert combine(rules, flags).apply(NAMES, SCORES) == ["sks", "extra", "long hair", "hat \\(object\\)", "kitty"]


@pytest.mark.parametrize(("text", "named"), [
    ("exclude-re ([a-z", "exclude-re ([a-z"),
    ("replace cat", "replace cat"),
    ("replace =dog", "replace =dog"),
    ("rename cat=dog", "rename cat=dog"),
    ("spaces please", "spaces please"),
])
def test_bad_rules_are_errors_naming_the_rule(text: str, named: str) -> None:
    with pytest.raises(CaptionRuleError, match="rules") as info:
        parse_rules_text(f"first x\n{text}\n", "rules.txt")
    assert named in str(info.value)


def test_rules_naming_unknown_classes_are_refused() -> None:
    make_rules(exclude=["cat"], replace=["cat=kitty"]).check_classes(NAMES)
    with pytest.raises(CaptionRuleError, match="'replace dog=puppy'"):
        make_rules(replace=["dog=puppy"]).check_classes(NAMES)
    with pytest.raises(CaptionRuleError, match="'exclude dog'"):
        make_rules(exclude=["dog"]).check_classes(NAMES)
