"""The benchmarks write their results as sections of one page (``--page``), run end to end on tiny inputs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench import export_speed, tag_speed, train_speed
from bench.results_page import read_section, write_section
from models import ModelMeta, build_model, save_checkpoint


def test_write_section_replaces_its_own_section_and_keeps_the_rest(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Results\n\nintro\n")
    write_section("b", "other", page)
    write_section("a", "old", page)
    write_section("a", "new", page)
    text = page.read_text()
    assert text.startswith("# Results\n\nintro\n")
    assert read_section("a", page) == "new" and read_section("b", page) == "other"
    assert text.count("<!-- bench:a -->") == 1 and "old" not in text
    with pytest.raises(ValueError, match="section name"):
        write_section("Bad Name", "x", page)


def test_decode_benchmark_writes_the_decode_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    threads = torch.get_num_threads()
    try:
        assert tag_speed.main(["decode", "--sizes", "16", "--seconds", "0", "--page", str(page)]) == 0
    finally:
        torch.set_num_threads(threads)
    text = read_section("decode-cpu", page)
    assert text is not None and "Command: `python -m bench.tag_speed decode --sizes 16 --seconds 0 --page" in text
    assert "Machine: " in text and "PyTorch 1 thread" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and " px | " in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 448 x 448", "| 1024 x 768", "| 4000 x 3000"]


def test_export_benchmark_writes_one_row_per_precision(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    assert export_speed.main(["--arch", "resnet18", "--sizes", "32", "--batches", "1", "--budget", "0",
                              "--page", str(page), "--section", "export-tiny"]) == 0
    text = read_section("export-tiny", page)
    assert text is not None and read_section("export-cpu", page) is None
    rows = [line for line in text.splitlines() if line.startswith("| resnet18 + LgConv @32px")]
    assert [row.split(" | ")[1:3] for row in rows] == [["PyTorch eager", "fp32"], ["ONNX Runtime", "fp32"],
                                                       ["ONNX Runtime", "fp16"], ["ONNX Runtime", "int8 (cpu)"]]


def test_training_benchmark_writes_the_train_cpu_section(builtin_cache: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    assert train_speed.main(["--archs", "resnet18", "--data", "builtin:tiny", "--input", "synthetic",
                             "--image-sizes", "32", "--batch-size", "4", "--steps", "1", "--warmup", "0",
                             "--workers", "0", "--device", "cpu", "--page", str(page)]) == 0
    text = read_section("train-cpu", page)
    assert text is not None and "python -m bench.train_speed --archs resnet18" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| resnet18 |")]
    assert row.startswith("| resnet18 | none | 32 | 4 | fp32 | synthetic | 0 |") and float(row.split(" | ")[7]) > 0


def test_tag_speed_on_photos_gives_model_loader_and_tagger_rates(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i, size in enumerate([(120, 90), (90, 120)]):  # one landscape, one portrait "photo"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(photos / f"p{i}.jpg")
    (photos / "notes.txt").write_text("not a photo")
    made = tag_speed.photo_jpegs(sorted(photos.glob("*.jpg")), tmp_path / "made", 3, 64, 48)
    assert len({p.read_bytes() for p in made}) == 3  # distinct crops
    for path in made:
        with Image.open(path) as img:
            assert img.size == (64, 48) and img.format == "JPEG"
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "best.pt", build_model("resnet18", 2).state_dict(),
                    ModelMeta(classes=["a", "b"], arch="resnet18", image_size=32))
    page = tmp_path / "page.md"
    assert tag_speed.main([str(tmp_path / "best.pt"), "--photos", str(photos), "--photo-sizes", "64x48,40x30",
                           "--images", "5", "--batch-size", "2", "--seconds", "0", "--repeats", "1",
                           "--page", str(page)]) == 0
    text = read_section("tag-photos", page)
    assert text is not None and read_section("tag-cpu", page) is None
    assert "one of 2 photographs" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| best.pt |")]
    assert [row[2] for row in rows] == ["64 x 48", "40 x 30"]
    for row in rows:
        rates = [float(cell) for cell in row[3:6]]
        assert all(rate > 0 for rate in rates)
        assert row[6].endswith("%") and row[7].endswith("%") and float(row[8]) > 0 and row[9].rstrip(" |").endswith("%")
        model_only, loader, bound = float(row[3]), float(row[4]), float(row[8])
        assert bound == pytest.approx(1 / (1 / model_only + 1 / loader), rel=0.2)  # medians of per-round values


def test_tag_speed_refuses_bad_photo_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in [(["--photos", str(tmp_path / "none")], "no folder"),
                          (["--photos", str(tmp_path)], "no .jpg/.jpeg file"),
                          (["--photo-sizes", "800by600"], "expected WIDTHxHEIGHT")]:
        with pytest.raises(SystemExit) as exc:
            tag_speed.main(["model.onnx", *args, "--page", str(tmp_path / "page.md")])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_engines_benchmark_rate_leaves_out_everything_before_the_first_batch() -> None:
    """bench.tag_engines times an engine from its first batch of results to its last: a slow start-up does not
    count, and neither do the first batch's images; a single batch has no rate."""
    import time

    from bench.tag_engines import FirstBatchClock

    class SlowStart:
        def __init__(self, batches: list[int], start_up: float) -> None:
            self.batches, self.start_up = batches, start_up

        def score(self, job: object, plan: object, report: object) -> Iterator[list[None]]:
            time.sleep(self.start_up)
            for i, size in enumerate(self.batches):
                if i:
                    time.sleep(0.05)
                yield [None] * size

    clock = FirstBatchClock(SlowStart([2, 3, 1], start_up=1.0))
    assert sum(len(batch) for batch in clock.score(None, None, None)) == 6
    assert (clock.first_images, clock.images) == (2, 6)
    assert clock.first_at is not None
    span = clock.last_at - clock.first_at
    assert 0.1 <= span < 0.9  # the two gaps, not the 1 s start-up
    assert clock.rate() == pytest.approx(4 / span)  # the 4 images after the first batch
    single = FirstBatchClock(SlowStart([5], start_up=0.0))
    assert len(list(single.score(None, None, None))) == 1 and single.rate() is None


def test_first_run_benchmark_times_the_head_only_step_cold_and_warm(builtin_cache: Path, tmp_path: Path) -> None:
    from bench import train_speed

    page = tmp_path / "page.md"
    features = builtin_cache / "features"
    before = sorted(features.rglob("*")) if features.is_dir() else []
    options = "--arch resnet18 --weights none --image-size 32 --epochs 2"
    assert train_speed.main(["first-run", "--data", "builtin:tiny", "--steps", "head-only", "--train-options",
                             options, "--page", str(page)]) == 0
    text = read_section("first-run", page)
    assert text is not None and f"--train-options '{options}'" in text and "`builtin:tiny`: " in text
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[2] for line in text.splitlines() if line.startswith("| ")}
    assert set(cells) == {"step", "head only, feature pass", "head only, the head's epochs"}
    assert "per 1,000 images (train + val:" in cells["head only, feature pass"]
    assert "(2 epochs; run:" in cells["head only, the head's epochs"]
    assert float(cells["head only, the head's epochs"].split(" s per epoch")[0]) >= 0
    # the steps computed their features in their own fresh caches, never in the session's
    assert (sorted(features.rglob("*")) if features.is_dir() else []) == before


def test_first_run_benchmark_refuses_unknown_steps(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import train_speed

    with pytest.raises(SystemExit) as exc:
        train_speed.main(["first-run", "--steps", "quick-start,warm-up"])
    assert exc.value.code == 2 and "unknown step(s) warm-up" in capsys.readouterr().err


def test_first_run_fresh_cache_links_datasets_but_not_what_a_first_run_computes(tmp_path: Path) -> None:
    from bench.train_speed import fresh_cache

    real = tmp_path / "real"
    for name in ("builtin", "features", "openclipart", "tuxpaint"):
        (real / name).mkdir(parents=True)
    made = fresh_cache(tmp_path / "fresh", real)
    assert sorted(p.name for p in made.iterdir()) == ["openclipart", "tuxpaint"]
    assert (made / "openclipart").resolve() == (real / "openclipart").resolve()


def test_fine_tune_e2e_report_scores_the_label_free_pick_against_the_head(tmp_path: Path) -> None:
    """bench.fine_tune_e2e's report: the criterion's pick with patience over both phases, the gain over the head alone
    of the same seed, the selection loss and the candidate's own arguments (k's per-seed value left out)."""
    from bench.fine_tune_e2e import report

    def epoch(phase: int, observed: float, test: float) -> dict[str, float]:
        scores = dict.fromkeys(("an-loss", "observed-auc", "observed-rank"), observed)
        return {**scores, "observed-map": observed, "val_full": test, "test": test, "phase": phase, "k": 2.0}

    head = [epoch(1, 30, 50), epoch(1, 31, 52)]
    tuned = [epoch(1, 31, 52), epoch(2, 33, 55), epoch(2, 32, 58), *[epoch(2, 30, 60 + i) for i in range(4)]]
    for tag, per, argv in (("head", head, ["--trainable", "head"]), ("x", tuned, ["--method", "x", "--hp", "k=2"])):
        record = {"dev_set": "s", "seed": 0, "tag": tag, "train": 1000, "device": "cpu", "per_epoch": per,
                  "epoch_seconds": None if tag == "head" else 2.0,
                  "argv": ["--name", f"s-seed0-{tag}", *argv, "--workers", "2"]}
        (tmp_path / f"s-seed0-{tag}.json").write_text(json.dumps(record))
    rows = [line for line in report(tmp_path).splitlines() if line.startswith("| s |")]
    # patience 3 stops after epochs 3-5 without a better criterion: epoch 2 (test 55) is picked, the best is 63
    assert rows[0] == ("| s | `--trainable head` | 1 | 52.00 | - | 0/1 | 0.00 | 52.00 | n/a |")
    assert rows[1] == ("| s | `--method x` (k: the head's estimate) | 1 | 55.00 | +3.00 (1/1 above) | 1/1 | 8.00 | "
                       "55.00 | 2.00 |")


class _FakeReviewer:
    """Suggestions over 2,000 images of 3 labels each, the first present: the ranking drops answered pairs."""

    def __init__(self) -> None:
        self.seen: list[int] = []  # answers known at each ranking

    def ranking(self, answers: dict, split: str, top: int, order: str) -> list[tuple[str, str, float]]:
        self.seen.append(len(answers))
        rows = [(f"img{i}", f"c{j}", 1.0 - 1e-4 * (3 * i + j)) for i in range(2000) for j in range(3)]
        return [row for row in rows if row[:2] not in answers][:top]

    def truth(self, pair: tuple[str, str]) -> bool:
        return pair[1] == "c0"


def test_review_simulation_answers_in_rounds_by_the_time_model() -> None:
    from bench import review

    fake = _FakeReviewer()
    steps, rankings = review.simulate(fake, review.Plan.parse("pair/100/train/rare"), (1.6, 1.0, 0.28))
    assert fake.seen == list(range(0, 1200, 100)) and len(rankings) == 12  # 30 minutes at 1.6 s: 1,125 answers
    assert len({pair for pair, _, _ in steps}) == len(steps) == 1125
    assert steps[-1][2] == pytest.approx(1125 * 1.6) and sum(t for _, t, _ in steps) == 375
    fake = _FakeReviewer()
    steps, _ = review.simulate(fake, review.Plan.parse("image2/0/train/balanced"), (1.6, 1.0, 0.28))
    assert fake.seen == [0]  # one ranking
    # an image shows its 2 most likely pending labels; its third comes next, as the demo's queue shows it
    assert [pair for pair, _, _ in steps[:4]] == [("img0", "c0"), ("img0", "c1"), ("img0", "c2"), ("img1", "c0")]
    two, one = 1.6 + 1.0 + 0.28 * 2, 1.6 + 0.28  # two labels shown and one ticked, then one unticked; each saved
    assert steps[1][2] == steps[0][2] == pytest.approx(two) and steps[2][2] == pytest.approx(two + one)
    with pytest.raises(ValueError, match="bad plan"):
        review.Plan.parse("image0/10/train/rare")
    with pytest.raises(ValueError, match="bad plan"):
        review.Plan.parse("pair/10/train")  # no order


def test_review_report_gives_gap_closed_per_checkpoint_and_per_minute(tmp_path: Path) -> None:
    from bench import review

    rows = [{"kind": kind, "at": at, "answers": at * 30 if kind == "minutes" else at, "yes": 10, "minutes": 1.0,
             "test_mAP": 50.0 + at / 100 if kind == "answers" else 50.0 + at / 10, "val_mAP_full": 41.0}
            for kind, marks in (("answers", review.ANSWERS), ("minutes", review.MINUTES)) for at in marks]
    record = {"dev_set": "tuxpaint", "seed": 0, "train_images": 10, "unobserved_present": 5,
              "given": {"test_mAP": 50.0, "val_mAP_full": 40.0}, "full": {"test_mAP": 60.0, "val_mAP_full": 50.0},
              "seconds_model": [1.6, 1.0, 0.28], "plans": {"pair/0/train/rare": {"rows": rows, "rankings": 1,
                                                                           "ranking_seconds": 2.0, "seconds": 9.0}}}
    (tmp_path / "tuxpaint-seed0.json").write_text(json.dumps(record))
    text = review.report(tmp_path, "cmd")
    row = "| pair/0/train/rare | 900 (10) | 10.0% / 10.0% | 25.0% / 50.0% / 100.0% | 10.0% / 20.0% / 30.0% (30.0%) |"
    assert row + " 53.00 ± 0.00 |" in text  # a row per plan: answers in 30 minutes, gaps by answers and by minutes
    assert "| pair/0/train/rare | 1 | 10.0% / 10.0% | 50.0% / 30.0% | 1.00% |" in text  # the summary over the sets
