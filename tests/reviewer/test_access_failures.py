"""Reviewer reads that fail are in the access log too: past the statement timeout, or a 500.

A read that failed inside its transaction used to roll its access-log row back
with it, so a timeout or an unexpected error left no trace of the query. Here,
on the running service's real database: a read held up by a lock until its
statement timeout fires is logged ``timeout`` (503) and raised as
`ReviewerTimeout`; a read whose feature replay raises is logged ``failed``
(500) with the error, and the error still reaches the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from service.contract import FeatureFunction
from service.contract.errors import Unavailable
from service.storage.reviewer_audit import Reviewer, ReviewerAccess
from tests.reviewer.conftest import PRINCIPALS, World

WHO = Reviewer(PRINCIPALS["reviewer"], "reviewer")


class _RaisingFeatures(FeatureFunction):
    """A feature function that cannot replay stored requests (say, a newer, wrong one)."""

    def __call__(self, *_: Any) -> Any:
        raise ValueError("feature replay broke")


def _last_access_id(world: World) -> int:
    with world.engine.connect() as conn:
        last = conn.execute(text("SELECT coalesce(max(access_id), 0) FROM reviewer_access_log"))
        return int(last.scalar_one())


def _logged(world: World, after: int) -> list[tuple[Any, ...]]:
    with world.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT principal, endpoint, parameters, outcome, status, detail"
                " FROM reviewer_access_log WHERE access_id > :a ORDER BY access_id"
            ),
            {"a": after},
        )
        return [tuple(r) for r in rows]


@pytest.fixture()
def protocols_locked(world: World) -> Iterator[None]:
    """An ACCESS EXCLUSIVE lock on ``protocol_versions``, held until the test ends."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with world.engine.begin() as conn:
            conn.execute(text("LOCK TABLE protocol_versions IN ACCESS EXCLUSIVE MODE"))
            held.set()
            release.wait(60)  # hang guard

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30)
    yield
    release.set()
    thread.join(30)


def test_a_read_past_its_statement_timeout_is_logged_as_timeout(
    world: World, protocols_locked: None
) -> None:
    access = ReviewerAccess(world.engine, statement_timeout_ms=300)
    start = _last_access_id(world)
    with pytest.raises(Unavailable, match="statement timeout") as raised:
        access.experiments(WHO)
    assert type(raised.value).__name__ == "ReviewerTimeout"
    rows = _logged(world, start)
    assert [r[:5] for r in rows] == [(WHO.principal, "experiments", {}, "timeout", 503)]
    assert "300 ms statement timeout" in rows[0][5]


def test_a_read_that_fails_unexpectedly_is_logged_as_failed(world: World) -> None:
    access = ReviewerAccess(world.engine, features=_RaisingFeatures())
    start = _last_access_id(world)
    with pytest.raises(ValueError, match="feature replay broke"):
        access.request(WHO, "rv-1")
    rows = _logged(world, start)
    assert [r[:5] for r in rows] == [
        (WHO.principal, "request", {"request_id": "rv-1"}, "failed", 500)
    ]
    assert rows[0][5] == "ValueError: feature replay broke"
