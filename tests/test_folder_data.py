"""The ``folder:`` dataset kind (class-per-folder trees) on fabricated trees: layouts, one image under several
class folders, classes.txt, ignored files, and every bad tree reported at once (exit status 2 from train)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.data.folder import is_class_tree, load_folder
from models.data.protocol import ObservedSpec, build_protocol
from models.data.registry import detect_kind, load_dataset, spec_dataset_name
from models.data.types import DataError

ROOT_DIR = Path(__file__).resolve().parents[1]


def image(path: Path, colour: tuple[int, int, int] = (120, 30, 200), size: int = 4) -> Path:
    """Write a small PNG (its bytes depend on ``colour`` and ``size``) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), colour).save(path)
    return path


def labels_by_name(part: object) -> dict[str, list[int]]:
    """``{file name: label row}`` of a LabelledImages."""
    return {p.name: row.tolist() for p, row in zip(part.paths, part.labels, strict=True)}  # type: ignore[attr-defined]


def error_of(root: Path, **kwargs: object) -> str:
    with pytest.raises(DataError) as info:
        load_folder(root, progress=False, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_flat_tree_copy_hardlink_symlink_merge_and_same_names_stay_apart(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """One image under cat/ and dog/ (a copy, a hard link, a symlink) is one image with two positives; cat/001
    and dog/001 with different bytes stay two images; non-image and hidden files are ignored and counted."""
    root = tmp_path / "pets"
    image(root / "cat" / "001.png", (1, 0, 0))
    image(root / "dog" / "001.png", (2, 0, 0))  # same name, other bytes: distinct
    shared = image(root / "cat" / "both.png", (3, 0, 0))
    shutil.copyfile(shared, root / "dog" / "both-copy.png")  # copy: identical bytes
    linked = image(root / "cat" / "linked.png", (4, 0, 0))
    (root / "bird").mkdir()
    os.link(linked, root / "bird" / "linked.png")  # hard link
    sym = image(root / "dog" / "sym.png", (5, 0, 0))
    os.symlink(sym, root / "bird" / "sym-link.png")
    image(root / "bird" / "nested" / "deep.png", (6, 0, 0))  # images below a class folder belong to it
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "dog" / ".DS_Store").write_bytes(b"\0")

    splits = load_folder(root, progress=False)
    assert splits.classes == ["bird", "cat", "dog"]
    assert splits.val is None and splits.test is None and splits.source == f"folder:{root}"
    by_path = {p.relative_to(root).as_posix(): row.tolist()
               for p, row in zip(splits.train.paths, splits.train.labels, strict=True)}
    assert by_path == {  # a merged image keeps the first of its paths in sorted order
        "bird/linked.png": [1, 1, 0], "bird/nested/deep.png": [1, 0, 0], "bird/sym-link.png": [1, 0, 1],
        "cat/001.png": [0, 1, 0], "cat/both.png": [0, 1, 1], "dog/001.png": [0, 0, 1],
    }
    err = capsys.readouterr().err
    assert "3 images are filed under several class folders" in err
    assert "2 files ignored" in err


def test_split_tree_classes_txt_order_and_protocol_holds_out_val(tmp_path: Path) -> None:
    """ROOT/{train,test}/<class>/: classes.txt fixes the order; no val folder -> the protocol holds val out of
    train; a class may be absent from test."""
    root = tmp_path / "split"
    (root).mkdir()
    (root / "classes.txt").write_text("zebra\nant\n")
    for i in range(10):
        image(root / "train" / "zebra" / f"z{i}.png", (i, 1, 1))
        image(root / "train" / "ant" / f"a{i}.png", (i, 2, 2))
    image(root / "test" / "ant" / "t0.png", (0, 3, 3))
    splits = load_dataset(f"folder:{root}")
    assert splits.classes == ["zebra", "ant"]
    assert len(splits.train) == 20 and splits.val is None
    assert splits.test is not None and splits.test.labels.tolist() == [[0, 1]]
    protocol = build_protocol(splits, ObservedSpec("single"))
    assert len(protocol.train) == 16 and len(protocol.val) == 4
    assert spec_dataset_name(f"folder:{root}") == "split"


def test_explicit_val_split_is_used_and_bare_path_is_detected(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    image(root / "train" / "a" / "1.png", (1, 1, 1))
    image(root / "train" / "b" / "2.png", (2, 2, 2))
    image(root / "val" / "b" / "3.png", (3, 3, 3))
    assert is_class_tree(root) and detect_kind(root) == "folder"
    assert is_class_tree(root / "train") and not is_class_tree(root / "train" / "a")
    splits = load_dataset(str(root))
    assert splits.val is not None and labels_by_name(splits.val) == {"3.png": [0, 1]}
    assert spec_dataset_name(str(root)) == "tree"


def test_every_problem_of_a_bad_tree_is_listed_in_one_error(tmp_path: Path) -> None:
    root = tmp_path / "bad"
    image(root / "train" / "cat" / "ok.png", (1, 1, 1))
    (root / "train" / "empty").mkdir(parents=True)  # empty class folder
    (root / "train" / "textonly").mkdir()
    (root / "train" / "textonly" / "readme.txt").write_text("x")  # a class folder with no image
    image(root / "test" / "owl" / "t.png", (2, 2, 2))  # a class with no training image
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"not a jpeg at all")  # corrupt
    truncated = root / "train" / "cat" / "truncated.png"
    data = (image(tmp_path / "full.png", (3, 3, 3), size=32)).read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    os.symlink(tmp_path / "missing.png", root / "train" / "cat" / "dangling.png")  # unreadable
    image(root / "train" / "loose.png", (4, 4, 4))  # image outside any class folder
    leak = image(root / "train" / "cat" / "leak.png", (5, 5, 5))
    shutil.copyfile(leak, root / "test" / "owl" / "leak.png")  # the same image in train and test

    message = error_of(root)
    assert message.startswith(f"{root}: 8 problem(s)")
    for fragment in (
        f"empty class folder (no image file): {root / 'train' / 'empty'}",
        f"empty class folder (no image file): {root / 'train' / 'textonly'}",
        "class 'owl' has no training image",
        f"corrupt or unreadable image: {root / 'train' / 'cat' / 'broken.jpg'}",
        f"corrupt or unreadable image: {root / 'train' / 'cat' / 'truncated.png'}",
        f"unreadable image: {root / 'train' / 'cat' / 'dangling.png'}",
        f"image outside any class folder: {root / 'train' / 'loose.png'}",
        "the same image is in splits train and test",
    ):
        assert fragment in message, fragment
    # without the image check the two corrupt files pass (training would skip them with a warning)
    assert "6 problem(s)" in error_of(root, verify=False)


def test_tree_structure_errors(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    image(mixed / "train" / "a" / "1.png")
    image(mixed / "cat" / "2.png")
    with pytest.raises(DataError, match=r"split folders \(train\) beside other folders \(cat\)"):
        load_folder(mixed, progress=False)
    no_train = tmp_path / "notrain"
    image(no_train / "test" / "a" / "1.png")
    assert "no train folder" in error_of(no_train)
    listed = tmp_path / "listed"
    image(listed / "a" / "1.png", (1, 1, 1))
    image(listed / "b" / "2.png", (2, 2, 2))
    (listed / "classes.txt").write_text("a\nc\n")
    message = error_of(listed)
    assert "class folder 'b' is not listed in" in message and "class 'c' has no training image" in message
    with pytest.raises(DataError, match="no such folder"):
        load_folder(tmp_path / "nowhere")
    with pytest.raises(DataError, match="unknown option 'bogus'"):
        load_dataset(f"folder:{listed}?bogus")


def test_copies_in_one_class_count_once(tmp_path: Path) -> None:
    root = tmp_path / "dups"
    first = image(root / "a" / "x.png", (9, 9, 9))
    shutil.copyfile(first, root / "a" / "x-copy.png")
    image(root / "b" / "y.png", (8, 8, 8))
    splits = load_folder(root, progress=False)
    assert labels_by_name(splits.train) == {"x-copy.png": [1, 0], "y.png": [0, 1]}  # first path in sorted order
    assert any("1 files are copies of another file in the same class folder" in n for n in splits.notes)


def test_train_cli_exits_2_listing_the_problems(tmp_path: Path) -> None:
    """``python -m train --data folder:BAD`` stops before training with exit status 2 and the full list."""
    root = tmp_path / "badcli"
    image(root / "a" / "1.png", (1, 1, 1))
    (root / "b").mkdir()
    (root / "c").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "train", "--data", f"folder:{root}", "--epochs", "1", "--runs-dir",
         str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT_DIR, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"empty class folder (no image file): {root / 'b'}" in proc.stderr
    assert f"empty class folder (no image file): {root / 'c'}" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_label_matrix_dtype_and_order_are_stable(tmp_path: Path) -> None:
    root = tmp_path / "order"
    for name in ("b", "a"):
        for i in (2, 1):
            image(root / name / f"{i}.png", (ord(name), i, 0))
    first = load_folder(root, progress=False)
    second = load_folder(root, progress=False)
    assert [str(p) for p in first.train.paths] == [str(p) for p in second.train.paths]
    assert [p.relative_to(root).as_posix() for p in first.train.paths] == ["a/1.png", "a/2.png", "b/1.png", "b/2.png"]
    assert first.train.labels.dtype == np.uint8


def test_a_tree_with_images_in_two_folders_keeps_every_label_as_given(tmp_path: Path) -> None:
    """Your own data: every label you gave is an observed label (no single-positive draw), and a split with
    several labels on some image is partial, not full, unless declared."""
    root = tmp_path / "own"
    for i in range(30):
        image(root / ("cat" if i % 3 else "dog") / f"{i:02d}.png", (i, 10, 20))
    for i in range(0, 30, 10):  # every tenth image also in the other folder: two labels, as given
        source = root / ("cat" if i % 3 else "dog") / f"{i:02d}.png"
        shutil.copyfile(source, root / ("dog" if i % 3 else "cat") / f"{i:02d}-also.png")
    splits = load_dataset(f"folder:{root}?skip-verify")
    assert splits.complete_splits == ()
    protocol = build_protocol(splits, ObservedSpec("auto"), val_fraction=0.2)
    assert protocol.observed.kind == "all"
    np.testing.assert_array_equal(protocol.train_observed, protocol.train.labels)  # every given label kept
    assert protocol.train.labels.sum(1).max() == 2 and protocol.regimes["train"].kind == "partial"
    assert not protocol.train_labels_full and not protocol.train_has_full_labels
    declared = build_protocol(splits, ObservedSpec("auto"), val_fraction=0.2, labels="full")
    assert declared.regimes["train"].kind == "full"
    drawn = build_protocol(splits, ObservedSpec("single"), val_fraction=0.2)  # asked for: one positive drawn
    assert (drawn.train_observed.sum(1) == 1).all()
    assert "observed all: " in protocol.summary() and "labels/image of " in protocol.summary()


def test_a_folder_named_like_a_benchmark_gets_no_family_and_no_presets(tmp_path: Path) -> None:
    """Families are declared by the kinds, never guessed from the start of a name: a folder called ``coconut`` is a
    user's own data, with no published presets (a folder named as a family, ``coco``, is that family's export)."""
    from models.data.registry import spec_family
    from train.methods import METHODS, make_hparams
    from train.methods.base import dataset_family

    for name, family in (("coconut", ""), ("my-coco-photos", ""), ("coco", "coco")):
        root = tmp_path / name
        for i in range(3):
            image(root / "cat" / f"{i}.png", (i, 1, 1))
            image(root / "dog" / f"{i}.png", (i, 2, 2))
        assert load_dataset(f"folder:{root}").family == family and spec_family(f"folder:{root}") == family
        assert spec_family(str(root)) == family
    assert dataset_family("coconut") == "coconut" and dataset_family("coco2014") == "coco"
    assert make_hparams(METHODS["epr"], {}, "") == make_hparams(METHODS["epr"], {}, "coconut")
    assert make_hparams(METHODS["epr"], {}, "coco").k == pytest.approx(2.9)
    assert spec_family("coco:/nowhere") == "coco" and spec_family("builtin:tiny") == "builtin"


def test_the_walk_skips_hidden_entries_and_symlinked_folders_like_serve_tag(tmp_path: Path) -> None:
    """``folder:DIR`` and ``serve tag DIR`` see the same images (models/files/folder_walk.py): hidden files and
    folders are skipped, symlinked folders (class folders too) are not entered, and a note says so."""
    from models.files.folder_walk import find_images

    root = tmp_path / "pets"
    image(root / "cat" / "1.png", (1, 1, 1))
    image(root / "cat" / "._1.png", (2, 1, 1))  # a macOS resource fork: hidden
    image(root / "cat" / ".thumbs" / "t.png", (3, 1, 1))  # a hidden folder
    image(root / "dog" / "2.png", (4, 1, 1))
    image(tmp_path / "elsewhere" / "3.png", (5, 1, 1))
    (root / "dog" / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "bird").symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # a symlinked class folder
    splits = load_folder(root, progress=False)
    assert splits.classes == ["cat", "dog"]
    loaded = sorted(p.relative_to(root).as_posix() for p in splits.train.paths)
    assert loaded == [p.relative_to(root).as_posix() for p in find_images(root)] == ["cat/1.png", "dog/2.png"]
    assert any("symbolic links to folders not followed" in note for note in splits.notes)
