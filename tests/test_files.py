"""Atomic writes (files and folders): the old one survives any failure, and nothing temporary is left behind."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_dir, atomic_write_text, sha256_file


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "probe.json"
    atomic_write_text(target, "old")

    def half_then_crash(tmp):
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(target, half_then_crash)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["probe.json"]


def test_disk_full_is_one_clear_line(tmp_path):
    def full(tmp):
        tmp.write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        ValueprobeError, match=r"no space left on device writing .*x\.bin: free space and rerun"
    ):
        atomic_write(tmp_path / "x.bin", full)
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueprobeError, match="cannot write"):
        atomic_write_text(tmp_path / "missing-dir" / "f.txt", "x")


def test_sha256_file(tmp_path):
    data = b"value axis" * 100_000 * 3  # 3 MB: several 1 MiB blocks
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_folder_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "runs" / "shift"

    def two_files(folder):
        (folder / "a.json").write_text("new")
        (folder / "b.csv").write_text("rows")

    assert atomic_write_dir(target, two_files) == target  # parents created
    assert sorted(p.name for p in target.iterdir()) == ["a.json", "b.csv"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask  # a plain mkdir's mode, not mkdtemp's 0700

    def half_then_crash(folder):
        (folder / "a.json").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write_dir(target, half_then_crash)
    assert (target / "a.json").read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["shift"]  # no temporary folder left

    def full(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(ValueprobeError, match=r"no space left on device writing .*shift: free space"):
        atomic_write_dir(target, full)
    assert sorted(p.name for p in target.parent.iterdir()) == ["shift"]
    atomic_write_dir(target, lambda folder: (folder / "c").write_text("x"))
    assert [p.name for p in target.iterdir()] == ["c"]  # replaced, not merged
