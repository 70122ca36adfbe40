"""Reviewer reads that fail are in the access log too: past the statement timeout, or a 500.

A read that failed inside its transaction used to roll its access-log row back
with it, so a timeout or an unexpected error left no trace of the query. Here,
on the running service's real database: a read held up by a lock until its
statement timeout fires is logged ``timeout`` (503) and raised as
`ReviewerTimeout`; a read whose feature replay raises is logged ``failed``
(500) with the error, and the error still reaches the caller. Over HTTP, a
service whose reviewer statement timeout is 0.3 s answers such a read 503,
counts it as ``timeout`` and logs it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from service.contract import FeatureFunction
from service.contract.errors import Unavailable
from service.server.app import Service
from service.storage.reviewer.audit import Reviewer, ReviewerAccess
from tests.storage.reviewer.conftest import PRINCIPALS, World

WHO = Reviewer(PRINCIPALS["reviewer"], "reviewer")


class _RaisingFeatures(FeatureFunction):
    """A feature function that cannot replay stored requests (say, a newer, wrong one)."""

    def __call__(self, *_: Any) -> Any:
        raise ValueError("feature replay broke")


def _last_access_id(world: World | Engine) -> int:
    engine = world.engine if isinstance(world, World) else world
    with engine.connect() as conn:
        last = conn.execute(text("SELECT coalesce(max(access_id), 0) FROM reviewer_access_log"))
        return int(last.scalar_one())


def _logged(world: World | Engine, after: int) -> list[tuple[Any, ...]]:
    engine = world.engine if isinstance(world, World) else world
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT principal, endpoint, parameters, outcome, status, detail"
                " FROM reviewer_access_log WHERE access_id > :a ORDER BY access_id"
            ),
            {"a": after},
        )
        return [tuple(r) for r in rows]


@contextmanager
def _locked(engine: Engine) -> Iterator[None]:
    """An ACCESS EXCLUSIVE lock on ``protocol_versions``, held inside the block."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.begin() as conn:
            conn.execute(text("LOCK TABLE protocol_versions IN ACCESS EXCLUSIVE MODE"))
            held.set()
            release.wait(60)  # hang guard

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30)
    try:
        yield
    finally:
        release.set()
        thread.join(30)


@pytest.fixture()
def protocols_locked(world: World) -> Iterator[None]:
    """The lock on the shared service's database, held until the test ends."""
    with _locked(world.engine):
        yield


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


def test_over_http_a_read_past_its_timeout_is_a_503_counted_and_logged(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(evaluator_enabled=False, reviewer_statement_timeout_s=0.3)
    assert service.engine is not None
    value = service.metrics.registry.get_sample_value
    labels = {"endpoint": "experiments", "result": "timeout"}
    start = _last_access_id(service.engine)
    with (
        _locked(service.engine),
        httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as http,
    ):
        answer = http.get("/v1/reviewer/experiments", headers={"authorization": "Bearer r-tok"})
    assert answer.status_code == 503, answer.text
    assert "300 ms statement timeout" in answer.json()["message"]
    assert value("understudy_reviewer_queries_total", labels) == 1
    rows = _logged(service.engine, start)
    assert [r[1:5] for r in rows] == [("experiments", {}, "timeout", 503)]
