"""Atomic writes: the old file survives any failure, and no temporary file is left behind."""

from __future__ import annotations

import errno
import hashlib

import pytest

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_text, sha256_file


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
