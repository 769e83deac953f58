"""Sorting images into tag folders: each link mode, the untagged folder, re-runs without duplicates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serve.outputs.tag_folders import TagFolderError, TagFolders, folder_name, place


def _images(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.jpg").write_bytes(b"image a")
    (src / "sub" / "a.jpg").write_bytes(b"another image a")
    return src


def _entries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


@pytest.mark.parametrize("how", ["symlink", "hardlink", "copy"])
def test_each_mode_places_every_tag_once_and_reruns_add_nothing(tmp_path: Path, how: str) -> None:
    src = _images(tmp_path)
    spec = TagFolders(tmp_path / "sorted", how)
    runs = [(src / "a.jpg", "a.jpg", ["cat", "dog"]), (src / "sub" / "a.jpg", "sub/a.jpg", ["cat"]),
            (src / "sub" / "a.jpg", "sub/a.jpg", [])]
    assert [place(i, r, t, spec) for i, r, t in runs] == [2, 1, 1]
    assert _entries(spec.root) == ["_untagged/sub/a.jpg", "cat/a.jpg", "cat/sub/a.jpg", "dog/a.jpg"]
    assert (spec.root / "cat" / "sub" / "a.jpg").read_bytes() == b"another image a"
    entry = spec.root / "dog" / "a.jpg"
    assert entry.is_symlink() == (how == "symlink")
    assert os.path.samefile(entry, src / "a.jpg") == (how != "copy")
    assert [place(i, r, t, spec) for i, r, t in runs] == [0, 0, 0]  # a re-run duplicates nothing
    assert len(_entries(spec.root)) == 4


def test_an_entry_that_is_another_file_is_never_overwritten(tmp_path: Path) -> None:
    src = _images(tmp_path)
    spec = TagFolders(tmp_path / "sorted", "copy")
    (spec.root / "cat").mkdir(parents=True)
    (spec.root / "cat" / "a.jpg").write_bytes(b"the user's own file")
    with pytest.raises(TagFolderError, match="not overwritten"):
        place(src / "a.jpg", "a.jpg", ["cat"], spec)
    assert (spec.root / "cat" / "a.jpg").read_bytes() == b"the user's own file"


def test_folder_names() -> None:
    assert folder_name("AC/DC") == "AC_DC" and folder_name(" cat ") == "cat"
    for bad in ("", "..", "."):
        with pytest.raises(ValueError, match="cannot be a folder name"):
            folder_name(bad)
    with pytest.raises(ValueError, match="link mode"):
        TagFolders(Path("x"), "move")
