"""A real, tiny filesystem for disk-full tests: a tmpfs mounted for one test.

A simulated ENOSPC would test our idea of a full disk; a 1-2 MiB tmpfs is the
kernel's: partial writes, refused checkpoints, space that returns when a file is
deleted. Mounting needs root (CI containers and this project's boxes run as
root); elsewhere the test is skipped with a reason that says so, and the
monkeypatched unit tests in tests/pipeline/test_journal_disk_full.py still run.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest


@contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (mount's syntax: "2m") on `directory`; unmount after."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a tmpfs; not root, so not run")
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed ({mounted.stderr.strip()}); disk-full path not run")
    try:
        yield directory
    finally:
        # lazy: a descriptor a failed test left open must not leave the mount behind
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file in `directory` until the filesystem is full; its path."""
    path = directory / name
    chunk = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        # top off: a page partly free still takes small writes
        with suppress(OSError):
            while os.write(fd, b"\0"):
                pass
    finally:
        os.close(fd)
    return path


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged write could still use on `directory`'s filesystem."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
