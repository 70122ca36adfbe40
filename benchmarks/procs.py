"""Processes the benchmarks start: pinned to cores, measured, stopped by pid.

Only processes started here are ever signalled, by their own pid. The server
side (the service and the PostgreSQL it starts, which inherits its affinity)
and the load generator get disjoint cores when the machine has two or more:
``UNDERSTUDY_BENCH_SERVER_CPUS`` / ``UNDERSTUDY_BENCH_CLIENT_CPUS`` (comma
lists) override the split.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_split() -> tuple[set[int], set[int]]:
    """(server cpus, generator cpus)."""
    cpus = sorted(os.sched_getaffinity(0))

    def env(name: str, default: list[int]) -> set[int]:
        raw = os.environ.get(name)
        return {int(c) for c in raw.split(",")} if raw else set(default)

    if len(cpus) < 2:
        return set(cpus), set(cpus)
    return env("UNDERSTUDY_BENCH_SERVER_CPUS", cpus[1:]), env(
        "UNDERSTUDY_BENCH_CLIENT_CPUS", cpus[:1]
    )


class Child:
    """A started Python module: its pid, a line-oriented stdout, stop by pid."""

    def __init__(self, module: str, args: list[str], cpus: set[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        )
        self.pid = self.proc.pid

    def line(self, timeout: float = 120.0) -> dict[str, Any]:
        """The next JSON line on stdout (skipping noise), within `timeout`."""
        deadline = time.monotonic() + timeout
        out: IO[str] = self.proc.stdout  # type: ignore[assignment]
        while time.monotonic() < deadline:
            text = out.readline()
            if not text:
                raise RuntimeError(f"process {self.pid} exited (rc={self.proc.poll()})")
            text = text.strip()
            if text.startswith("{"):
                return dict(json.loads(text))
        raise TimeoutError(f"process {self.pid} said nothing for {timeout}s")

    def ask(self, command: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
        """Send one JSON command line, return the answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self.line(timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM this pid, then SIGKILL it if it lingers."""
        if self.proc.poll() is not None:
            return
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def cpu_seconds(pid: int, with_children: bool = False) -> float:
    """utime + stime of `pid` (+ its live children and reaped ones when asked)."""
    total = _stat_cpu(pid, reaped=with_children)
    if with_children:
        for child in _children(pid):
            total += _stat_cpu(child, reaped=False)
    return total


def rss_mb(pid: int) -> float:
    """Resident set size of `pid` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _stat_cpu(pid: int, reaped: bool) -> float:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out
