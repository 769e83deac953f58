"""``python -m models.data.class_subset``: a CSV dataset restricted to some classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.data.class_subset import keep_classes, main
from models.data.csv_format import load_csv
from models.data.types import DataError, LabelledImages


def _dataset(folder: Path) -> Path:
    (folder / "img").mkdir(parents=True)
    rows = [("a.png", "cat;dog", "train"), ("b.png", "bird", "train"), ("c.png", "dog", "test"),
            ("d.png", "bird;cat", "test"),
            ("e.png", "fish", "test")]
    for name, _, _ in rows:
        (folder / "img" / name).write_bytes(b"")
    (folder / "classes.txt").write_text("cat\ndog\nbird\nfish\n")
    lines = ["image,labels,split"] + [f"img/{name},{labels},{split}" for name, labels, split in rows]
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")
    return folder / "labels.csv"


def test_keep_classes_drops_columns_and_unlabelled_rows() -> None:
    images = LabelledImages([Path("a"), Path("b"), Path("c")], np.array([[1, 1, 0], [0, 0, 1], [0, 1, 0]]),
                            ["cat", "dog", "bird"])
    kept = keep_classes(images, ["dog", "cat"])  # the dataset's order is kept, not the argument's
    assert kept.classes == ["cat", "dog"]
    assert kept.paths == [Path("a"), Path("c")]
    np.testing.assert_array_equal(kept.labels, [[1, 1], [0, 1]])
    with pytest.raises(DataError, match="unknown class 'cow'"):
        keep_classes(images, ["cow"])


def test_command_writes_a_loadable_subset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _dataset(tmp_path / "src")
    assert main([str(source), "--keep", "cat,dog,cat", "--out", str(tmp_path / "out")]) == 0
    assert "2 of 4 classes; images kept: train 1, test 2" in capsys.readouterr().out
    subset = load_csv(tmp_path / "out" / "labels.csv")
    assert subset.classes == ["cat", "dog"]
    assert [p.name for p in subset.train.paths] == ["a.png"]
    np.testing.assert_array_equal(subset.train.labels, [[1, 1]])
    assert [p.name for p in subset.test.paths] == ["c.png", "d.png"]
    np.testing.assert_array_equal(subset.test.labels, [[0, 1], [1, 0]])
    assert all(p.is_absolute() and p.parent == tmp_path / "src" / "img" for p in subset.test.paths)

    assert main([str(source), "--keep", "bird", "--train-only", "--out", str(tmp_path / "train-only")]) == 0
    only = load_csv(tmp_path / "train-only" / "labels.csv")
    assert [p.name for p in only.train.paths] == ["b.png"] and only.test is None


def test_command_rejects_unknown_class_and_empty_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _dataset(tmp_path / "src")
    with pytest.raises(SystemExit) as exc:
        main([str(source), "--keep", "dgo", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "did you mean 'dog'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(source), "--keep", "fish", "--out", str(tmp_path / "out")])  # fish: a test image only
    assert exc.value.code == 2 and "no training image has one of the classes fish" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    before = source.read_text()
    with pytest.raises(SystemExit) as exc:
        main([str(source), "--keep", "cat", "--out", str(source.parent)])
    assert exc.value.code == 2 and "would overwrite the source" in capsys.readouterr().err
    assert source.read_text() == before
