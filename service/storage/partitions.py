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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Engine, text

from service.storage.engine import unavailable_on_failure
from service.storage.tables import PARTITIONED_TABLES

_DAY_S = 86_400


def ensure_partitions(engine: Engine, start: date, end: date) -> int:
    """Create the daily partitions for every day in ``[start, end]`` that lacks one.

    Returns the number of partitions created (three tables per day).

    Raises:
        Unavailable: the database cannot be reached.
    """
    if end < start:
        raise ValueError(f"`end` must be >= `start`, got {end} < {start}")
    with unavailable_on_failure("creating partitions"), engine.begin() as conn:
        created = conn.execute(
            text("SELECT understudy_ensure_partitions(:first, :last)"),
            {"first": start, "last": end},
        ).scalar()
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
    """Creates the day partitions traffic needs, within a window around now.

    Remembers which days it has handled, so the steady-state cost per batch is
    one set difference. Not thread-safe; one per writer.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        days_back: int = 7,
        days_ahead: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._days_back = days_back
        self._days_ahead = days_ahead
        self._clock = clock
        self._handled: set[int] = set()

    def ensure_for(self, request_times: Iterable[float]) -> int:
        """Make sure the days of `request_times` have partitions (within the window).

        Returns the number of partitions created.
        """
        days = {int(t // _DAY_S) for t in request_times} - self._handled
        if not days:
            return 0
        today = int(self._clock() // _DAY_S)
        lo, hi = today - self._days_back, today + self._days_ahead
        wanted = sorted(d for d in days if lo <= d <= hi)
        created = 0
        if wanted:
            epoch = date(1970, 1, 1)
            created = ensure_partitions(
                self._engine,
                epoch + timedelta(days=wanted[0]),
                epoch + timedelta(days=wanted[-1]),
            )
        self._handled |= days
        return created
