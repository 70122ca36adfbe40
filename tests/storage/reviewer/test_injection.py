"""Hostile filter values: a 4xx or an empty answer, never a 5xx or a database error.

Every query parameter and path parameter of the reviewer API gets quotes,
statement terminators with DROP / TRUNCATE / DELETE, LIKE wildcards, NUL,
undecodable bytes, right-to-left marks, huge strings. Afterwards every table
has exactly the rows and content it had before, and the API still answers.
"""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import text

from tests.storage.reviewer.conftest import EXPERIMENT, World

HOSTILE = [
    "'",
    "''",
    '"',
    "\\",
    "' OR '1'='1",
    "gavel-scorer' --",
    "'; DROP TABLE decisions; --",
    '"; TRUNCATE requests CASCADE; --',
    "1; DELETE FROM outcomes",
    "$$; DROP TABLE reviewer_access_log; $$",
    "1) OR (1=1",
    "%",
    "_",
    "*",
    "ok' UNION SELECT * FROM pg_shadow --",
    "ünïcödé ☃ 𝔘 \u202egnp.exe",
    "\u0000",
    "ok\x00",
    "a\x00'; DROP TABLE decisions; --",
    "\ufeff\u200b",
    "x" * 300,
    "x" * 20_000,
    "1e309",
    "-1",
    "9" * 40,
    "2026-05-01T00:00:00Z'; DROP TABLE requests; --",
]
_rng = random.Random(13)
HOSTILE += ["".join(chr(_rng.randrange(1, 0x2FFF)) for _ in range(40)) for _ in range(4)]
RAW = ["%ED%A0%80", "%FF%FE", "%C0%AF", "%00"]  # a surrogate, invalid UTF-8, overlong, NUL
PARAMETERS = (
    "policy",
    "policy_version",
    "experiment",
    "experiment_version",
    "workload_kind",
    "hardware_class",
    "disagreement",
    "status",
    "since",
    "until",
    "order",
    "limit",
    "cursor",
    "format",
)
TABLES = (
    "requests",
    "decisions",
    "outcomes",
    "pending_outcomes",
    "cluster_snapshots",
    "policies",
    "conflicts",
    "protocols",
    "protocol_versions",
    "protocol_events",
)


def _fingerprint(world: World) -> dict[str, Any]:
    """Row count and an md5 over every row's text of each table (as the service's role)."""
    with world.engine.connect() as conn:
        return {
            table: conn.execute(
                text(
                    f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
                    f" FROM {table} t"
                )
            ).one()
            for table in TABLES
        }


def _acceptable(response: Any) -> bool:
    if 400 <= response.status_code < 500:
        return True
    if response.status_code != 200:
        return False
    body = response.json()
    items = body["items"] if isinstance(body, dict) and "items" in body else body
    return items == [] or items is None


@pytest.fixture(scope="module")
def before(world: World) -> dict[str, Any]:
    return _fingerprint(world)


@pytest.mark.parametrize("parameter", PARAMETERS)
def test_hostile_filter_values_are_refused_or_empty(
    world: World, before: dict[str, Any], parameter: str
) -> None:
    bad: list[tuple[str, int, str]] = []
    with world.client() as http:
        for value in HOSTILE:
            response = http.get("/v1/reviewer/decisions", params={parameter: value})
            if not _acceptable(response):
                bad.append((value[:60], response.status_code, response.text[:200]))
        for raw in RAW:
            response = http.get(f"/v1/reviewer/decisions?{parameter}=ok{raw}")
            if not _acceptable(response):
                bad.append((raw, response.status_code, response.text[:200]))
    assert bad == []
    assert _fingerprint(world) == before


def test_hostile_path_values_are_refused_or_empty(world: World, before: dict[str, Any]) -> None:
    bad: list[tuple[str, int]] = []
    with world.client() as http:
        for value in [*HOSTILE, "../../metrics"]:
            for path in (
                f"/v1/reviewer/requests/{quote(value, safe='')}",
                f"/v1/reviewer/experiments/{quote(value, safe='')}/versions/1/events",
                f"/v1/reviewer/experiments/{EXPERIMENT}/versions/{quote(value, safe='')}/events",
                f"/v1/reviewer/experiments?protocol_id={quote(value, safe='')}",
            ):
                response = http.get(path)
                if not _acceptable(response):
                    bad.append((path[:80], response.status_code))
        for raw in RAW:
            response = http.get(f"/v1/reviewer/requests/rv-0{raw}")
            if not _acceptable(response):
                bad.append((raw, response.status_code))
    assert bad == []
    assert _fingerprint(world) == before


def test_the_log_and_the_api_are_intact_afterwards(world: World, before: dict[str, Any]) -> None:
    with world.client() as http:
        response = http.get("/v1/reviewer/decisions", params={"policy": "ok\x00"})
        page = http.get("/v1/reviewer/decisions", params={"policy": "gavel-scorer", "limit": 5})
    assert response.status_code == 400 and response.json()["field"] == "policy"
    assert page.status_code == 200 and len(page.json()["items"]) == 5
    assert _fingerprint(world) == before
    with world.engine.connect() as conn:  # the NUL was logged, escaped, not lost
        stored = conn.execute(
            text(
                "SELECT parameters ->> 'policy' FROM reviewer_access_log"
                " WHERE outcome = 'rejected' ORDER BY access_id DESC LIMIT 1"
            )
        ).scalar()
    assert stored == "ok\\u0000"
