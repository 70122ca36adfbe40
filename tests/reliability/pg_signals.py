"""Signals to an embedded PostgreSQL's processes, for fault tests: freeze, thaw, kill.

The processes are found from the postmaster's pid (``postmaster.pid``, via
`running_pid`) and its children (parent pids read from ``/proc``; Linux).
A frozen server is thawed in a ``finally``: a test that fails while the
server is stopped must not leave it stopped for the next one.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from service.storage import running_pid


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from ``/proc/<pid>/stat``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def server_pids(data_dir: Path) -> list[int]:
    """The postmaster of the server on `data_dir`, then every process under it."""
    pid = running_pid(data_dir)
    assert pid is not None, f"no PostgreSQL is running on {data_dir}"
    return [pid, *children(pid)]  # PostgreSQL's processes are all the postmaster's children


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@contextlib.contextmanager
def frozen(data_dir: Path) -> Iterator[list[int]]:
    """Every process of the server SIGSTOPped inside the block, SIGCONTed after it.

    The postmaster is stopped first, so no new backend is forked after the
    children were listed; the children are listed again once it is stopped.
    """
    postmaster = server_pids(data_dir)[0]
    stopped = [postmaster]
    try:
        os.kill(postmaster, signal.SIGSTOP)
        stopped = server_pids(data_dir)
        _signal_all(stopped[1:], signal.SIGSTOP)
        yield stopped
    finally:
        _signal_all(stopped, signal.SIGCONT)
