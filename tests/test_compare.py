"""The method comparison benchmark (``python -m bench.methods``): runs, reuse of finished runs, the table's
numbers, its section and plot on the results page."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.methods import (
    _train_argv,
    aggregate,
    last_epoch_val_map,
    main,
    markdown,
    parse_grid,
    parse_method,
    section_for,
)
from bench.results_page import read_section
from models.files.run_folder import CONFIG_FILE, METRICS_FILE
from train.config import build_parser, config_from_args


def _summary(test: float, val: float = 50.0, recovery: float | None = 40.0) -> dict:
    out = {"test": {"mAP": test}, "val": {"mAP": val}}
    if recovery is not None:
        out["train_recovery"] = {"mAP": recovery}
    return out


def test_aggregate_gap_recovered_and_statistics() -> None:
    rows = {r["method"]: r for r in aggregate({
        "an": [_summary(20.0), _summary(22.0)],
        "bce": [_summary(30.0), _summary(32.0)],
        "em": [_summary(26.0), _summary(26.0)],
    })}
    assert rows["an"]["gap"] == 0.0 and rows["bce"]["gap"] == 1.0
    assert rows["em"]["gap"] == pytest.approx((26 - 21) / (31 - 21))
    assert rows["an"]["test"] == pytest.approx((21.0, math.sqrt(2.0)))  # sample std over seeds
    assert rows["em"]["recovery"] == (40.0, 0.0)


def test_the_table_names_the_methods_below_an_only_when_an_is_in_it() -> None:
    with_an = markdown(aggregate({"an": [_summary(20.0)], "bce": [_summary(30.0)], "em": [_summary(19.0)],
                                  "opml": [_summary(21.0)]}), "cmd", "builtin", [], [])
    assert "Methods below `an`: em." in with_an
    without_an = markdown(aggregate({"em": [_summary(19.0)], "opml": [_summary(21.0)]}), "cmd", "builtin", [], [])
    assert "below `an`" not in without_an
    only_bounds = markdown(aggregate({"an": [_summary(20.0)], "bce": [_summary(30.0)]}), "cmd", "builtin", [], [])
    assert "below `an`" not in only_bounds  # no method to compare: no "none" line either


def test_last_epoch_val_map_reads_the_metrics_file(tmp_path: Path) -> None:
    assert math.isnan(last_epoch_val_map(tmp_path))  # no metrics file
    lines = [{"epoch": 1, "val_mAP": 30.0}, {"epoch": 2, "val_mAP": 25.0, "val_mAP_ema": 27.5}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    assert last_epoch_val_map(tmp_path) == 27.5  # the last epoch, the better of model and EMA
    rows = aggregate({"an": [{**_summary(20.0), "last_val": 25.0}, {**_summary(22.0), "last_val": 27.0}]})
    assert rows[0]["last_val"] == pytest.approx((26.0, math.sqrt(2.0)))
    assert "| an | 2 | 21.00 ± 1.41 | n/a | 0 | 50.00 ± 0.00 | 26.00 ± 1.41 | 40.00 ± 0.00 |" in markdown(
        rows, "cmd", "builtin", [], [])


def test_one_seed_has_no_spread_to_show() -> None:
    assert math.isnan(aggregate({"em": [_summary(19.0)]})[0]["test"][1])  # the spread of one seed is unknown
    text = markdown(aggregate({"em": [_summary(19.0)], "opml": [_summary(21.0)]}), "cmd", "builtin", [], [])
    assert "| em | 1 | 19.00 | n/a | n/a |" in text  # no "± 0.00"; no gap recovered or difference without an


def test_the_difference_to_an_pairs_runs_by_seed() -> None:
    an = [{**_summary(20.0), "seed": 0}, {**_summary(24.0), "seed": 1}, {**_summary(22.0), "seed": 2}]
    # em has no seed 1 (failed): only seeds 0 and 2 pair up, 21 - 20 and 21.5 - 22
    em = [{**_summary(21.0), "seed": 0}, {**_summary(21.5), "seed": 2}]
    rows = {r["method"]: r for r in aggregate({"an": an, "bce": [_summary(30.0)], "em": em})}
    mean, std, above, compared = rows["em"]["vs_an"]
    assert (mean, above, compared) == (0.25, 1, 2) and std == pytest.approx(math.sqrt(1.125))
    # the difference of the means would be 21.25 - 22 = -0.75: pairing keeps only comparable seeds
    text = markdown(list(rows.values()), "cmd", "builtin", [], [])
    assert "| em | 2 | 21.25 ± 0.35 | -9% | +0.25 ± 1.06 (1/2 above) |" in text
    assert "| an | 3 | 22.00 ± 2.00 | 0% | 0 |" in text
    one_seed = aggregate({"an": [_summary(20.0)], "em": [_summary(19.0)]})[1]  # no seed key: list position
    assert "| em | 1 | 19.00 | n/a | -1.00 (0/1 above) |" in markdown([one_seed], "cmd", "builtin", [], [])


def test_compare_runs_reuses_and_writes_the_table(builtin_cache: Path, tmp_path: Path) -> None:
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nkept as is\n")
    args = ["--methods", "an,bce", "--seeds", "0,1", "--data", "builtin:tiny", "--runs-dir", str(tmp_path / "runs"),
            "--page", str(page), "--", "--epochs", "1", "--image-size", "32", "--batch-size", "16", "--workers", "0",
            "--no-lgconv"]
    assert main(args) == 0
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["an-seed0", "an-seed1", "bce-seed0", "bce-seed1"]
    text = read_section("methods-builtin-tiny", page)
    assert text is not None and page.read_text().startswith("# Results\n\nkept as is\n")
    tests = {}
    for name in runs:
        s = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        tests.setdefault(name.split("-seed")[0], []).append(s["test"]["mAP"])
    for method, values in tests.items():
        mean = sum(values) / 2
        assert f"| {method} | 2 | {mean:.2f} ± " in text
    assert "| an | 2 |" in text
    diffs = [b - a for b, a in zip(tests["bce"], tests["an"], strict=True)]  # runs sorted: seed 0, then 1
    assert f"| {(diffs[0] + diffs[1]) / 2:+.2f} ± {abs(diffs[0] - diffs[1]) / math.sqrt(2):.2f} (" in text
    last = {name: last_epoch_val_map(tmp_path / "runs" / name) for name in runs}
    assert not any(math.isnan(v) for v in last.values())
    assert f"| {(last['an-seed0'] + last['an-seed1']) / 2:.2f} ± " in text  # the last epoch's val mAP column
    if sum(tests["bce"]) > sum(tests["an"]):  # the gap is defined only when the oracle beats an
        assert "| 0% |" in text and "| 100% |" in text
    else:
        assert "n/a" in text
    assert "python -m bench.methods --methods an,bce" in text and "-- --epochs 1" in text
    assert "(plots/methods-builtin-tiny.png)" in text
    assert (tmp_path / "plots" / "methods-builtin-tiny.png").stat().st_size > 1000
    mtimes = {p: (p / "summary.json").stat().st_mtime for p in (tmp_path / "runs").iterdir()}
    assert main(args) == 0  # everything is reused: no run is trained again
    assert all((p / "summary.json").stat().st_mtime == t for p, t in mtimes.items())
    assert page.read_text().count("<!-- bench:methods-builtin-tiny -->") == 1  # the section replaced, not added


def test_compare_rejects_unknown_methods(capsys: pytest.CaptureFixture[str]) -> None:
    for spec, name in (("an,magic", "magic"), ("an,ll-r+turbo", "turbo"), ("magic+boostlu", "magic")):
        with pytest.raises(SystemExit) as exc:
            main(["--methods", spec])
        assert exc.value.code == 2 and name in capsys.readouterr().err


def test_a_method_with_boostlu_trains_that_method_with_the_option(tmp_path: Path) -> None:
    assert parse_method("ll-r+boostlu") == ("ll-r", ["--boostlu"]) and parse_method("em") == ("em", [])
    argv = _train_argv("ll-r+boostlu", 0, "builtin:tiny", tmp_path, "ll-r+boostlu-seed0", ["--epochs", "1"])
    cfg = config_from_args(build_parser().parse_args(argv))
    assert (cfg.method, cfg.boostlu, cfg.name) == ("ll-r", 5.0, "ll-r+boostlu-seed0")


def _tiny(tmp_path: Path, *extra: str) -> list[str]:
    return ["--data", "builtin:tiny", "--seeds", "0", "--page", str(tmp_path / "m.md"), "--", "--epochs", "1",
            "--image-size", "32", "--batch-size", "16", "--workers", "0", "--no-lgconv", *extra]


def test_warm_start_trains_an_first_then_fine_tunes_its_backbone_with_a_new_head(
        builtin_cache: Path, tmp_path: Path) -> None:
    warm, runs = tmp_path / "warm", tmp_path / "runs"
    assert main(["--methods", "em", "--runs-dir", str(runs), "--warm-start", str(warm), *_tiny(tmp_path)]) == 0
    assert (warm / "an-seed0" / "summary.json").is_file()  # the base run, trained with the same arguments
    config = json.loads((runs / "em-seed0" / CONFIG_FILE).read_text())["config"]
    assert config["weights"] == str(warm / "an-seed0" / "best.pt") and config["reset_head"] is True
    assert "starts from the backbone of" in str(read_section("methods-builtin-tiny", tmp_path / "m.md"))


def test_a_run_folder_with_other_settings_is_an_error_not_reused(
        builtin_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    assert main(["--methods", "an", "--runs-dir", str(runs), *_tiny(tmp_path)]) == 0
    summary = runs / "an-seed0" / "summary.json"
    before = summary.stat().st_mtime
    assert main(["--methods", "an", "--runs-dir", str(runs), *_tiny(tmp_path, "--lr", "1e-4")]) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "lr: 0.002 there, 0.0001 here" in err
    assert summary.stat().st_mtime == before
    assert main(["--methods", "an", "--runs-dir", str(runs), *_tiny(tmp_path, "--workers", "1")]) == 0  # machine-only


def test_the_default_comparison_covers_every_registered_method() -> None:
    """Every method that trains on the default protocol (iu needs observed negatives, --observed 'single?neg=N')."""
    from bench.methods import DEFAULT_METHODS
    from train.methods import METHODS

    assert sorted(DEFAULT_METHODS) == sorted(n for n, m in METHODS.items() if not m.uses_observed_negatives)


def test_the_default_section_is_named_after_the_data_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert section_for("builtin") == "methods-builtin"
    assert section_for("builtin:tiny") == "methods-builtin-tiny"
    assert section_for("coco:/data/COCO_2014@0.5") == "methods-coco-data-coco-2014-0-5"
    with pytest.raises(SystemExit) as exc:
        main(["--section", "Bad_Name"])
    assert exc.value.code == 2 and "Bad_Name" in capsys.readouterr().err


def test_parse_grid_reads_one_option_and_rejects_conflicts() -> None:
    assert parse_grid("linear-init-lr=1e-2, 1e-3", ["--epochs", "0"]) == ("linear-init-lr", ["1e-2", "1e-3"])
    assert parse_grid("--lr=1e-4", []) == ("lr", ["1e-4"])
    for bad in ("lr", "=1e-3", "lr=", "lr=1e-3,1e-3"):
        with pytest.raises(ValueError):
            parse_grid(bad, [])
    with pytest.raises(ValueError, match="both in --grid and in the fixed"):
        parse_grid("lr=1e-3,1e-4", ["--epochs", "1", "--lr", "1e-2"])


def test_grid_keeps_the_run_with_the_best_val_map_for_each_method(builtin_cache: Path, tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "m.md"
    args = ["--methods", "an", "--seeds", "0", "--data", "builtin:tiny", "--runs-dir", str(runs), "--page",
            str(out), "--section", "methods-grid", "--grid", "linear-init-lr=1e-1,1e-4", "--", "--epochs", "0",
            "--linear-init", "2", "--image-size", "32", "--batch-size", "16", "--workers", "0", "--no-lgconv"]
    assert main(args) == 0
    assert sorted(p.name for p in runs.iterdir()) == ["an-seed0-linear-init-lr1e-1", "an-seed0-linear-init-lr1e-4"]
    summaries = {p.name.rsplit("lr", 1)[1]: json.loads((p / "summary.json").read_text()) for p in runs.iterdir()}
    for value in summaries:
        config = json.loads((runs / f"an-seed0-linear-init-lr{value}" / CONFIG_FILE).read_text())["config"]
        assert config["linear_init_lr"] == float(value) and config["epochs"] == 0
    value, best = max(summaries.items(), key=lambda kv: kv[1]["val"]["mAP"])
    text = str(read_section("methods-grid", out))
    (row,) = [line for line in text.splitlines() if line.startswith("| an |")]
    assert row.startswith(f"| an | 1 | {best['test']['mAP']:.2f} |") and row.endswith(f"| {value} |")
    assert "chosen --linear-init-lr" in text and "every value of `--linear-init-lr` in {1e-1, 1e-4}" in text


def test_a_run_stopped_before_its_first_resumable_epoch_is_started_again(builtin_cache: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert main(["--methods", "an", "--runs-dir", str(runs), *_tiny(tmp_path)]) == 0
    run = runs / "an-seed0"
    for name in ("last.pt", "summary.json", "best.pt"):  # as if killed before the first last.pt was written
        (run / name).unlink()
    assert main(["--methods", "an", "--runs-dir", str(runs), *_tiny(tmp_path)]) == 0
    assert (run / "summary.json").is_file()
    assert len((run / METRICS_FILE).read_text().splitlines()) == 1  # a fresh run, not the old lines plus new ones
    (run / "summary.json").unlink()
    (run / "last.pt").unlink()
    (run / "notes.txt").write_text("not the trainer's")  # anything else in the folder is left alone: an error
    assert main(["--methods", "an", "--runs-dir", str(runs), *_tiny(tmp_path)]) == 1
    assert (run / "notes.txt").is_file() and (run / "best.pt").is_file()
