"""Daily partitions of the tables that grow with traffic.

``requests``, ``decisions`` and ``outcomes`` are partitioned by RANGE on
``request_time`` (Runtime's clock), one partition per UTC day named
``<table>_pYYYYMMDD``, plus ``<table>_default`` for any time without one — so
a write is never refused for lack of a partition. The SQL function
``understudy_ensure_partitions(first_day, last_day)`` (created by the first
migration, callable from psql or cron as well) creates missing days and
moves rows that already landed in the DEFAULT partition into them.

`PartitionKeeper` lets the writer create partitions as traffic reaches a new
day, but only within a window around the wall clock: a Runtime clock that is
far off must not make the writer create thousands of tables. Rows outside the
window go to the DEFAULT partition until an operator creates their days.

Why days ahead, under a lock timeout: attaching a partition needs an ACCESS
EXCLUSIVE lock on the DEFAULT partition, which waits for every open read of
the table (a reviewer's ``BEGIN; SELECT ... FROM decisions`` holds a share lock
until it ends), and every write queued behind that lock waits too. Created at
midnight, the next day's partition once stalled the log for as long as a
reviewer kept a read open. So the keeper keeps today and the next
`days_ahead` days created in advance, each day in its own short transaction
under ``lock_timeout`` (`PARTITION_LOCK_TIMEOUT_MS`): a creation that would
wait gives up at once (`PartitionsBusy`), the batch is written anyway (to its
day's partition if it exists, else to DEFAULT, whose rows the later creation
moves), and the keeper retries after `retry_s`. A week of lead means a read
would have to stay open for days to leave a day without its partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta

import psycopg
from sqlalchemy import Engine, exc, text

from service.contract.errors import Unavailable
from service.storage.engine import unavailable_on_failure
from service.storage.log.tables import PARTITIONED_TABLES

log = logging.getLogger(__name__)

_DAY_S = 86_400
PARTITION_LOCK_TIMEOUT_MS = 500
"""How long the keeper's partition DDL may wait for a lock before giving up (and
retrying later): short, because writes queue behind a waiting ATTACH."""
DAYS_AHEAD = 7
"""Days after today whose partitions the keeper keeps created."""
RETRY_S = 30.0
"""How long the keeper waits after a creation gave up before it tries again."""


class PartitionsBusy(Unavailable):
    """Creating a partition would have waited for a lock held by a read; nothing changed."""


def ensure_partitions(
    engine: Engine, start: date, end: date, *, lock_timeout_ms: int | None = None
) -> int:
    """Create the daily partitions for every day in ``[start, end]`` that lacks one.

    Returns the number of partitions created (three tables per day). With
    `lock_timeout_ms`, give up rather than wait longer for any lock (all or
    nothing: one transaction).

    Raises:
        PartitionsBusy: a lock was not granted within `lock_timeout_ms`.
        Unavailable: the database cannot be reached.
    """
    if end < start:
        raise ValueError(f"`end` must be >= `start`, got {end} < {start}")
    if lock_timeout_ms is not None and lock_timeout_ms <= 0:
        raise ValueError(f"`lock_timeout_ms` must be > 0, got {lock_timeout_ms}")
    try:
        with unavailable_on_failure("creating partitions"), engine.begin() as conn:
            if lock_timeout_ms is not None:
                conn.execute(
                    text("SELECT set_config('lock_timeout', :ms, true)"),
                    {"ms": f"{lock_timeout_ms}ms"},
                )
            created = conn.execute(
                text("SELECT understudy_ensure_partitions(:first, :last)"),
                {"first": start, "last": end},
            ).scalar()
    except Unavailable as err:
        cause = err.__cause__
        if isinstance(cause, exc.DBAPIError) and isinstance(
            cause.orig, psycopg.errors.LockNotAvailable
        ):
            raise PartitionsBusy(
                f"creating partitions for {start}..{end} would wait more than "
                f"{lock_timeout_ms} ms for a lock (a long read is open); retry later"
            ) from cause
        raise
    return int(created or 0)


def list_partitions(engine: Engine, table: str) -> list[str]:
    """Names of `table`'s partitions (the DEFAULT one included), sorted."""
    if table not in PARTITIONED_TABLES:
        raise ValueError(f"`table` must be one of {PARTITIONED_TABLES}, got {table!r}")
    with unavailable_on_failure("listing partitions"), engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = to_regclass(:t) ORDER BY c.relname"
            ),
            {"t": table},
        ).scalars()
        return [str(r) for r in rows]


def day_of(unix_s: float) -> date:
    """The UTC day a Unix time falls on (the partition it belongs to)."""
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=unix_s)).date()


class PartitionKeeper:
    """Keeps today's and the next days' partitions created, and those traffic needs.

    On each batch: today and the `days_ahead` days after it, plus the days of
    the batch's request times within ``[today - days_back, today + days_ahead]``,
    are created if the keeper has not handled them yet — one day per
    transaction, under a `lock_timeout_ms` lock timeout. A day whose creation
    gave up (`PartitionsBusy`) stays unhandled and is tried again once `retry_s`
    have passed; the write itself never waits for it. Remembers what it handled,
    so the steady-state cost per batch is one set difference. Not thread-safe;
    one per writer.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        days_back: int = 7,
        days_ahead: int = DAYS_AHEAD,
        lock_timeout_ms: int = PARTITION_LOCK_TIMEOUT_MS,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._days_back = days_back
        self._days_ahead = days_ahead
        self._lock_timeout_ms = lock_timeout_ms
        self._retry_s = retry_s
        self._clock = clock
        self._handled: set[int] = set()
        self._retry_at = float("-inf")
        self.gave_up = 0
        """Creations that gave up on a lock (each retried later)."""

    def ensure_for(self, request_times: Iterable[float]) -> int:
        """Make sure the days ahead and those of `request_times` (in the window) exist.

        Returns the number of partitions created.

        Raises:
            Unavailable: the database cannot be reached (not `PartitionsBusy`).
        """
        now = self._clock()
        today = int(now // _DAY_S)
        ahead = set(range(today, today + self._days_ahead + 1))
        days = ({int(t // _DAY_S) for t in request_times} | ahead) - self._handled
        if not days or now < self._retry_at:
            return 0
        lo, hi = today - self._days_back, today + self._days_ahead
        self._handled |= {d for d in days if not lo <= d <= hi}  # never created here
        epoch = date(1970, 1, 1)
        created = 0
        for day in sorted(d for d in days if lo <= d <= hi):
            when = epoch + timedelta(days=day)
            try:
                created += ensure_partitions(
                    self._engine, when, when, lock_timeout_ms=self._lock_timeout_ms
                )
            except PartitionsBusy as busy:
                self.gave_up += 1
                self._retry_at = now + self._retry_s
                log.warning("%s; writing on, next try in %.0f s", busy, self._retry_s)
                break
            self._handled.add(day)
        return created
