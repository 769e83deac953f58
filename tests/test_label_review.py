"""Label review end to end: labels.csv with known negatives (``-name``), the regime line counting them, suggestions
from cross-fitted heads (``python -m train suggest``), and retraining with the answers (``--from-run --review``)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from models.data.csv_format import load_csv, write_csv
from models.data.observed_file import read_protocol_file
from models.data.protocol import ObservedSpec, build_protocol, parse_observed, sample_observed
from models.data.registry import load_dataset
from models.data.review_file import AnswerLog, ReviewItem, read_review, write_review
from models.data.reviewed_labels import apply_review
from models.data.types import DataError
from train.__main__ import main as train_main

FAST = ["--arch", "resnet18", "--weights", "none", "--image-size", "32", "--no-lgconv", "--trainable", "head",
        "--epochs", "2", "--batch-size", "16", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def reviewed(builtin_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """builtin:tiny as a user's labels.csv (one label per training image, 'dog'-style known negatives on the first
    ten images, the test images fully labelled), a head run on it, its suggestions and a reviewer who answers them
    from the hidden labels."""
    tiny = load_dataset("builtin:tiny")
    assert tiny.test is not None
    base = tmp_path_factory.mktemp("review")
    observed = sample_observed(tiny.train.labels, ObservedSpec("single"))
    negatives = np.zeros_like(tiny.train.labels)
    for i in range(10):
        negatives[i, np.flatnonzero(tiny.train.labels[i] == 0)[0]] = 1
    train = tiny.train.__class__(tiny.train.paths, (observed > 0).astype(np.uint8), tiny.classes, negatives)
    csv_path = write_csv(base / "data", {"train": train, "test": tiny.test})
    runs = base / "runs"
    assert train_main(["--data", f"csv:{csv_path}", *FAST, "--runs-dir", str(runs), "--name", "first"]) == 0
    hidden = {str(p): row for p, row in zip(tiny.train.paths, tiny.train.labels, strict=True)}
    return {"tiny": tiny, "csv": csv_path, "runs": runs, "hidden": hidden, "base": base, "negatives": negatives}


def test_labels_csv_reads_and_writes_known_negatives(tmp_path: Path) -> None:
    from PIL import Image

    for name in ("a", "b"):
        Image.new("RGB", (8, 8)).save(tmp_path / f"{name}.png")
    (tmp_path / "labels.csv").write_text("image,labels\na.png,cat;-dog\nb.png,dog\nb.png,-cat\n")
    data = load_csv(tmp_path / "labels.csv")
    assert data.classes == ["cat", "dog"] and data.train.labels.tolist() == [[1, 0], [0, 1]]
    assert data.train.negatives is not None and data.train.negatives.tolist() == [[0, 1], [1, 0]]
    again = load_csv(write_csv(tmp_path / "copy", {"train": data.train}))
    assert again.train.negatives is not None and again.train.negatives.tolist() == [[0, 1], [1, 0]]
    protocol = build_protocol(data, parse_observed("auto"), val_fraction=0.0 + 0.5)
    observed = np.concatenate([protocol.train_observed, protocol.val_observed])
    assert sorted(observed.tolist()) == [[-1, 1], [1, -1]]
    assert "1 known negatives" in protocol.regimes["train"].describe()
    for labels, message in [("cat;-cat", "present and as absent"), ("-", "empty class name")]:
        (tmp_path / "labels.csv").write_text(f"image,labels\na.png,{labels}\n")
        with pytest.raises(DataError, match=message):
            load_csv(tmp_path / "labels.csv")
    (tmp_path / "labels.csv").write_text("image,labels\na.png,cat\na.png,-cat\n")
    with pytest.raises(DataError, match=r"labels\.csv:3: 'cat' is given as present and as absent"):
        load_csv(tmp_path / "labels.csv")
    (tmp_path / "classes.txt").write_text("cat\n-dog\n")
    with pytest.raises(DataError, match="begins with '-'"):
        load_csv(tmp_path / "labels.csv")


def test_review_files_keep_the_last_answer_and_survive_a_cut_line(tmp_path: Path) -> None:
    items = [ReviewItem("/x/1.png", "dog", 0.9, None, ("cat",)), ReviewItem("/x/2.png", "cat", 0.4, True)]
    for name in ("r.csv", "r.jsonl"):
        write_review(tmp_path / name, items)
        assert read_review(tmp_path / name) == items
    (tmp_path / "bad.csv").write_text("image,label,answer\n/x/1.png,dog,maybe\n")
    with pytest.raises(DataError, match=r"bad\.csv:2: answer 'maybe' is neither yes nor no"):
        read_review(tmp_path / "bad.csv")
    log = AnswerLog(tmp_path / "a.jsonl")
    log.record("/x/1.png", "dog", True)
    log.record("/x/2.png", "cat", False)
    log.record("/x/1.png", "dog", None)  # undo
    with open(log.path, "a") as f:
        f.write('{"image": "/x/3.png", "lab')  # a kill in the middle of a write
    assert log.read() == {("/x/2.png", "cat"): False}


def test_apply_review_changes_observed_labels_and_given_labels_only_on_own_data(builtin_cache: Path,
                                                                                tmp_path: Path) -> None:
    tiny = load_dataset("builtin:tiny")
    protocol = build_protocol(tiny, parse_observed("single"))
    image, present = str(protocol.train.paths[0]), protocol.train.labels[0]
    absent = tiny.classes[int(np.flatnonzero(present == 0)[0])]
    unobserved = tiny.classes[int(np.flatnonzero((present == 1) & (protocol.train_observed[0] == 0))[0])]
    answers = tmp_path / "a.csv"
    answers.write_text(f"image,label,answer\n{image},{unobserved},yes\n{image},{absent},no\n{image},nope,yes\n"
                       f"/elsewhere.png,{absent},no\n")
    reviewed, record = apply_review(protocol, [str(answers)])
    row = reviewed.train_observed[0]
    assert row[tiny.classes.index(unobserved)] == 1 and row[tiny.classes.index(absent)] == -1
    assert (record["confirmed"], record["rejected"], record["unknown_labels"], record["other_images"]) == (1, 1, 1, 1)
    assert np.array_equal(reviewed.train.labels, protocol.train.labels)  # a benchmark keeps its hidden labels
    assert reviewed.train_has_full_labels
    # a validation answer: nothing where val has full labels; with val=observed the split becomes partial, not full
    val_image, val_row = str(protocol.val.paths[0]), protocol.val.labels[0]
    for spec in ("single", "single?val=observed"):
        observed = build_protocol(tiny, parse_observed(spec))
        assert observed.val_observed is not None
        missing = tiny.classes[int(np.flatnonzero((val_row == 1) & (observed.val_observed[0] == 0))[0])]
        answers.write_text(f"image,label,answer\n{val_image},{missing},yes\n")
        reviewed, record = apply_review(observed, [str(answers)])
        assert spec != "single" or "val has full labels, so these change nothing" in record["describe"]
    assert reviewed.val.labels[0, tiny.classes.index(missing)] == 1 and reviewed.regimes["val"].kind == "partial"
    assert record["val"] == {"confirmed": 1, "rejected": 0, "labels": "partial", "selection": "label-free"}


def test_suggestions_rank_unobserved_pairs_and_retraining_records_the_answers(
        reviewed: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    runs, base = Path(str(reviewed["runs"])), Path(str(reviewed["base"]))
    hidden: dict[str, np.ndarray] = reviewed["hidden"]  # type: ignore[assignment]
    tiny = reviewed["tiny"]
    first = runs / "first"
    labels = json.loads((first / "config.json").read_text())["resolved"]["labels"]
    assert labels["train"]["known_negatives"] + labels["val"]["known_negatives"] == 10
    out = base / "review.csv"
    capsys.readouterr()
    assert train_main(["suggest", str(first), "-o", str(out), "--top", "30", "--order", "balanced",
                       "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "wrote 30 suggestions" in said and f"--from-run {first} --review" in said
    assert json.loads((base / "review.suggest.json").read_text()) == {  # how it was made, for the demo's rounds
        "run": str(first.resolve()), "runs_dir": None, "top": 30, "per_image": 0, "order": "balanced",
        "split": "train", "review": []}
    items = read_review(out)
    record = read_protocol_file(first / "observed.npz")
    protocol = build_protocol(load_dataset(f"csv:{reviewed['csv']}"), parse_observed("auto"))
    assert np.array_equal(protocol.train_observed, record.train_observed)
    row_of = {str(p): i for i, p in enumerate(protocol.train.paths)}
    assert len(items) == 30 and all(item.answer is None for item in items)
    first_round = items[:len(tiny.classes)]  # balanced: every class's most likely pair, strongest first
    assert len({item.label for item in first_round}) == len(tiny.classes)
    assert [item.score for item in first_round] == sorted((item.score for item in first_round), reverse=True)
    for item in items:  # unobserved pairs of training images, each with the labels its image has
        i, j = row_of[item.image], tiny.classes.index(item.label)
        assert record.train_observed[i, j] == 0
        assert item.given == tuple(tiny.classes[c] for c in np.flatnonzero(record.train_observed[i] > 0))
    assert train_main(["suggest", str(first), "-o", str(out)]) == 2  # never overwrites answers
    assert "exists" in capsys.readouterr().err

    answers = [ReviewItem(i.image, i.label, i.score, bool(hidden[i.image][tiny.classes.index(i.label)]))
               for i in items[:20]]
    write_review(base / "answers.jsonl", answers)
    yes = sum(a.answer for a in answers)
    assert train_main(["--from-run", str(first), "--review", str(base / "answers.jsonl"), "--name", "second"]) == 0
    second = runs / "second"
    config = json.loads((second / "config.json").read_text())
    review = config["resolved"]["review"]
    assert (review["confirmed"], review["rejected"]) == (yes, 20 - yes)
    assert config["config"]["data"] == json.loads((first / "config.json").read_text())["config"]["data"]
    assert config["config"]["review"] == [str(base / "answers.jsonl")]
    again = read_protocol_file(second / "observed.npz")
    for a in answers:
        assert again.train_observed[row_of[a.image], tiny.classes.index(a.label)] == (1 if a.answer else -1)
    assert f"review: {yes} confirmed, {20 - yes} rejected" in capsys.readouterr().out

    # a second round asks none of the answered pairs again
    assert train_main(["suggest", str(second), "-o", str(base / "round2.jsonl"), "--top", "30", "--no-progress"]) == 0
    asked = {(i.image, i.label) for i in answers}
    assert not asked & {(i.image, i.label) for i in read_review(base / "round2.jsonl")}


def test_balanced_order_takes_every_class_s_best_pair_first() -> None:
    """``balanced``: each class's most likely missing pair (strongest first), then each class's second; ``rare``: the
    same, a class with fewer labels asked more often; ``score``: by probability alone; observed pairs (given or known
    negative) are never suggested; ``--per-image`` caps."""
    from models.data.types import LabelledImages
    from train.cross_fitting import Pool
    from train.suggestions import rank_pairs

    observed = np.array([[1, 0, 0], [0, 1, -1], [0, 0, 0], [0, 0, 1]], dtype=np.int8)
    logits = np.array([[0, 3, 2], [1, 0, 5], [4, 2.5, 0.5], [0, 1, 0]], dtype=np.float64)
    pool = Pool(LabelledImages([Path(n) for n in "abcd"], (observed > 0).astype(np.uint8), ["x", "y", "z"]),
                observed, None, np.zeros(4, dtype=np.int64))  # type: ignore[arg-type]
    pairs = {order: [(i.image, i.label) for i in rank_pairs(pool, logits, 20, order_by=order)[0]]
             for order in ("balanced", "score")}
    assert pairs["balanced"] == [("c", "x"), ("a", "y"), ("a", "z"), ("c", "y"), ("b", "x"), ("c", "z"),
                                 ("d", "y"), ("d", "x")]
    assert pairs["score"] == [("c", "x"), ("a", "y"), ("c", "y"), ("a", "z"), ("b", "x"), ("d", "y"), ("c", "z"),
                              ("d", "x")]
    # rare: a class's k-th pair at k x sqrt(its labels + 1): y (no label) is asked three times as often as x (8)
    rare_observed = np.zeros((12, 2), dtype=np.int8)
    rare_observed[:8, 0] = 1
    rare_logits = np.stack([np.r_[np.zeros(8), [4.0, 3.0, 2.0, 1.0]], -0.1 * np.arange(12)], 1)
    rare_pool = Pool(LabelledImages([Path(str(i)) for i in range(12)], rare_observed.clip(0), ["x", "y"]),
                     rare_observed, None, np.zeros(12, dtype=np.int64))  # type: ignore[arg-type]
    first = {order: [f"{i.label}{i.image}" for i in rank_pairs(rare_pool, rare_logits, 8, order_by=order)[0]]
             for order in ("rare", "balanced")}
    assert first == {"rare": ["y0", "y1", "x8", "y2", "y3", "y4", "x9", "y5"],
                     "balanced": ["x8", "y0", "x9", "y1", "x10", "y2", "x11", "y3"]}
    items, scored = rank_pairs(pool, logits, 3, per_image=1, order_by="score")
    assert scored == 8 and [(i.image, i.label) for i in items] == [("c", "x"), ("a", "y"), ("b", "x")]
    assert items[1].given == ("x",) and items[1].score == pytest.approx(1 / (1 + np.exp(-3)))



def test_a_run_does_not_resume_on_answers_that_changed(reviewed: dict[str, object], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A review log that grew after the run started (the demo kept appending) would change the labels mid-run:
    --resume refuses and names --from-run; with the answers unchanged it resumes."""
    from interrupt import interrupt_after_saves

    runs = Path(str(reviewed["runs"]))
    protocol = build_protocol(load_dataset(f"csv:{reviewed['csv']}"), parse_observed("auto"))
    column = int(np.flatnonzero(protocol.train_observed[0] == 0)[0])
    items = [ReviewItem(str(path), protocol.classes[column]) for path in protocol.train.paths[:2]]
    log = AnswerLog(tmp_path / "answers.jsonl")
    log.record(items[0].image, items[0].label, True)
    args = ["--from-run", str(runs / "first"), "--review", str(log.path), "--runs-dir", str(tmp_path),
            "--name", "killed"]
    interrupt_after_saves(monkeypatch)
    assert train_main(args) == 130
    monkeypatch.undo()
    log.record(items[1].image, items[1].label, False)  # the reviewer went on
    capsys.readouterr()
    assert train_main(["--resume", str(tmp_path / "killed")]) == 2
    err = capsys.readouterr().err
    assert "changed since" in err and "--from-run" in err
    log.record(items[1].image, items[1].label, None)  # undone: the answers are as they were
    assert train_main(["--resume", str(tmp_path / "killed")]) == 0


def test_validation_images_are_scored_by_heads_that_never_trained_on_them(reviewed: dict[str, object]) -> None:
    """``training_pool(held_out_val=True)``: the validation rows sit in no fold; each is scored by one fold's head and
    none trains on them or picks its epoch on them."""
    import torch

    from train.cross_fitting import fold_data, training_pool
    from train.prepared_run import RunData
    from train.selection import Rows

    dataset = load_dataset(f"csv:{reviewed['csv']}")
    protocol = build_protocol(dataset, parse_observed("auto"))
    data = RunData(dataset, protocol, b"")
    features = {split: Rows(torch.zeros(len(images), 4), torch.ones(len(images), dtype=torch.bool))
                for split, images in (("train", protocol.train), ("val", protocol.val))}
    pool = training_pool(data, features, held_out_val=True)
    val = {str(p) for p in protocol.val.paths}
    assert [str(p) for p in pool.images.paths[len(protocol.train):]] == [str(p) for p in protocol.val.paths]
    for fold in range(5):
        fitted, rows = fold_data(data, pool, fold)
        assert not val & {str(p) for p in [*fitted.splits.train.paths, *fitted.splits.val.paths]}
        assert len(rows["scored"].values) == int((pool.folds == fold).sum()) + len(range(fold, len(val), 5))
    assert sorted(pool.folds[len(protocol.train):]) == sorted(-1 - np.arange(len(val)) % 5)


def test_validation_answers_reach_the_selection_criterion_and_the_thresholds(
        reviewed: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    """``suggest --split val`` asks about validation images only; their answers become the val labels the run
    selects its epoch by (observed-map, still label-free: the split is partial) and the export calibrates on."""
    from export.validation_data import rebuild_splits
    from models.checkpoint import load_checkpoint
    from models.data.label_regime import detect_regime
    from models.evaluation.criteria import observed_map

    runs, base = Path(str(reviewed["runs"])), Path(str(reviewed["base"]))
    hidden: dict[str, np.ndarray] = reviewed["hidden"]  # type: ignore[assignment]
    tiny = reviewed["tiny"]
    first = runs / "first"
    protocol = build_protocol(load_dataset(f"csv:{reviewed['csv']}"), parse_observed("auto"))
    row_of = {str(p): i for i, p in enumerate(protocol.val.paths)}
    out = base / "val-review.csv"
    capsys.readouterr()
    assert train_main(["suggest", str(first), "-o", str(out), "--split", "val", "--top", "40", "--no-progress"]) == 0
    assert "validation images" in capsys.readouterr().out
    assert json.loads(out.with_suffix(".suggest.json").read_text())["split"] == "val"
    items = read_review(out)
    assert len(items) == 40 and all(item.image in row_of for item in items)
    assert all(protocol.val_observed[row_of[i.image], tiny.classes.index(i.label)] == 0 for i in items)
    answers = [ReviewItem(i.image, i.label, i.score, bool(hidden[i.image][tiny.classes.index(i.label)]))
               for i in items]
    yes = sum(a.answer for a in answers)
    assert 0 < yes < 40
    write_review(base / "val-answers.jsonl", answers)
    assert train_main(["--from-run", str(first), "--review", str(base / "val-answers.jsonl"), "--name", "val"]) == 0
    said = capsys.readouterr().out
    assert f"on validation images: {yes} confirmed, {40 - yes} rejected; val stays partial" in said
    run = runs / "val"
    config = json.loads((run / "config.json").read_text())["resolved"]
    summary = json.loads((run / "summary.json").read_text())
    assert config["review"]["val"] == summary["val_review"] == {"confirmed": yes, "rejected": 40 - yes,
                                                                "labels": "partial", "selection": "label-free"}
    assert config["labels"]["val"]["kind"] == "partial" and config["selection"]["criterion"] == "observed-map"
    scores = np.load(run / "scores.npz")
    labels = scores["val_labels"]
    for a in answers:
        assert labels[row_of[a.image], tiny.classes.index(a.label)] == a.answer
    assert np.array_equal(labels, np.maximum(protocol.val.labels, labels))  # the given labels kept
    assert summary["best_score"] == pytest.approx(observed_map(scores["val_logits"], labels), abs=1e-3)
    assert observed_map(scores["val_logits"], labels) != observed_map(scores["val_logits"], protocol.val.labels)
    rebuilt = rebuild_splits(load_checkpoint(run / "best.pt").meta)  # what the export calibrates on
    assert np.array_equal(rebuilt.val.labels, labels)
    assert detect_regime(rebuilt.val.labels, "val", complete=rebuilt.has_full_labels("val")).kind == "partial"


def test_demo_rounds_re_rank_with_train_suggest_in_the_background(reviewed: dict[str, object],
                                                                   tmp_path: Path) -> None:
    """The demo's rounds: after N answers a real ``train suggest`` process ranks the pairs again with the answers
    (the sidecar's options and review files passed on); the queue takes the new order, keeps every answer, including
    one given while the round ran, and the file reopens as the same queue."""
    from serve.demo.review import ReviewQueue
    from serve.demo.review_rounds import ReviewRounds, read_sidecar

    runs = Path(str(reviewed["runs"]))
    hidden: dict[str, np.ndarray] = reviewed["hidden"]  # type: ignore[assignment]
    classes = reviewed["tiny"].classes  # type: ignore[attr-defined]
    earlier = tmp_path / "earlier.answers.jsonl"
    earlier.write_text("")
    out = tmp_path / "review.csv"
    assert train_main(["suggest", "first", "--runs-dir", str(runs), "-o", str(out), "--top", "12", "--per-image",
                       "2", "--order", "score", "--review", str(earlier), "--no-progress"]) == 0
    made, why = read_sidecar(out)
    assert made == {"run": str((runs / "first").resolve()), "runs_dir": str(runs.resolve()), "top": 12,
                    "per_image": 2, "order": "score", "split": "train", "review": [str(earlier.resolve())]}, why
    queue = ReviewQueue.open(out)
    scores = {pair: item.score for pair, item in queue.items.items()}
    rounds = ReviewRounds(queue, made, every=3)
    try:
        for _ in range(3):
            item = queue.view().item
            queue.answer(item.image, item.label, bool(hidden[item.image][classes.index(item.label)]))
        assert queue.status == "re-ranking in the background..." and rounds.thread is not None
        assert "--per-image 2 --order score" in " ".join(rounds.command(out, 9))
        item = queue.view().item  # answered while the round runs
        queue.answer(item.image, item.label, False)
        deadline = time.monotonic() + 180
        while rounds.thread is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        rounds.close()
    answers = AnswerLog(queue.log.path).read()
    assert len(answers) == 4 and queue.answers == answers
    assert re.fullmatch(rf"round 2 re-ranked {len(queue.pending)} pairs in \d+ s", queue.status), queue.status
    # 12 - 3 asked for, the image on screen kept first, the tail cut: the file keeps its 12 pairs
    assert len(queue.pending) == 8 and len(queue.items) == 12 and not set(queue.pending) & set(answers)
    assert set(list(queue.items)[:4]) == set(answers)  # the answered items first
    assert any(queue.items[p].score != scores[p] for p in queue.pending if p in scores), "scored again"
    assert all(len([p for p in queue.pending if p[0] == image]) <= 2 for image in queue.by_image
               if image != queue.pending[0][0])
    assert [(i.image, i.label) for i in read_review(out)] == list(queue.items)
    reopened = ReviewQueue.open(out)
    assert (reopened.pending, reopened.answers) == (queue.pending, queue.answers)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
