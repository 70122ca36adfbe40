"""Crafted cursors are a 400 naming ``cursor``, and every such query is in the access log.

Cursors are opaque to clients but not secret (base64url JSON; the filter
digest is a plain hash), so anyone can forge one for the filters they send. A
key of 10^20 µs, 2^63 or -10^20 once overflowed the date arithmetic into a
500 (or a reset), and because the failed read's transaction rolled back, the
query left no row in the access log. Here each forged cursor goes over real
HTTP to the running service; the answer must be a 400 naming ``cursor`` with
the problem, and the access log must hold the query, as sent (long values cut), with its status.
"""

from __future__ import annotations

import base64
import json

import pytest
from sqlalchemy import text

from service.storage.reviewer.audit import loggable
from service.storage.reviewer.query import DecisionFilter
from tests.storage.reviewer.conftest import PRINCIPALS, World

DIGEST = DecisionFilter().digest("asc")  # the filters of a bare listing


def _forged(key: list[object], ensure_ascii: bool = True) -> str:
    body = {"v": 1, "o": "asc", "f": DIGEST, "k": key}
    raw = json.dumps(body, ensure_ascii=ensure_ascii).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


FORGED = {
    "time 10^20 µs": (_forged([10**20, "rv-1", "best-fit", "1"]), "outside"),
    "time 2^63 µs": (_forged([2**63, "rv-1", "best-fit", "1"]), "outside"),
    "time -10^20 µs": (_forged([-(10**20), "rv-1", "best-fit", "1"]), "outside"),
    "time -1 µs": (_forged([-1, "rv-1", "best-fit", "1"]), "outside"),
    "time 2^64 µs": (_forged([2**64, "rv-1", "best-fit", "1"]), "outside"),
    "time of 300 digits": (_forged([10**300, "rv-1", "best-fit", "1"]), "outside"),
    "time as text": (_forged(["1700000000", "rv-1", "best-fit", "1"]), "not an integer"),
    "lone surrogate in request_id": (_forged([1, "rv-\ud800", "best-fit", "1"]), "request_id"),
    "policy_name not text": (_forged([1, "rv-1", 7, "1"]), "policy_name"),
    "empty policy_version": (_forged([1, "rv-1", "best-fit", ""]), "policy_version"),
    "request_id of 600 chars": (_forged([1, "r" * 600, "best-fit", "1"]), "request_id"),
}


def _access_rows(world: World, after: int) -> list[tuple[str, dict[str, str], str, int, str]]:
    with world.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT principal, parameters, outcome, status, detail FROM reviewer_access_log"
                " WHERE access_id > :a AND endpoint = 'decisions' ORDER BY access_id"
            ),
            {"a": after},
        ).all()
    return [tuple(r) for r in rows]


def _last_access_id(world: World) -> int:
    with world.engine.connect() as conn:
        last = conn.execute(text("SELECT coalesce(max(access_id), 0) FROM reviewer_access_log"))
        return int(last.scalar_one())


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_forged_cursor_is_a_400_naming_cursor_and_is_logged(world: World, case: str) -> None:
    cursor, problem = FORGED[case]
    metric = world.service.metrics.registry.get_sample_value
    labels = {"endpoint": "decisions", "result": "rejected"}
    before = metric("understudy_reviewer_queries_total", labels) or 0.0
    start = _last_access_id(world)

    with world.client() as http:
        answer = http.get("/v1/reviewer/decisions", params={"cursor": cursor})

    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["field"] == "cursor"
    assert problem in body["message"]
    rows = _access_rows(world, start)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (PRINCIPALS["reviewer"], loggable({"cursor": cursor}), "rejected", 400)
    ]
    assert problem in rows[0][4]
    assert metric("understudy_reviewer_queries_total", labels) == before + 1


def test_an_issued_cursor_still_pages(world: World) -> None:
    with world.client() as http:
        first = http.get("/v1/reviewer/decisions", params={"limit": 2}).json()
        assert first["next_cursor"]
        second = http.get(
            "/v1/reviewer/decisions", params={"limit": 2, "cursor": first["next_cursor"]}
        )
    assert second.status_code == 200, second.text
    keys = [(i["request_time"], i["request_id"]) for i in first["items"] + second.json()["items"]]
    assert keys == sorted(keys) and len(keys) == 4
