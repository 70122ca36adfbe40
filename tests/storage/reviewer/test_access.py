"""Who may read, and the record of every read: roles, the access log, metrics, OpenAPI."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text

from service.transport.http.reviewer import DECISION_PARAMETER_DOCS
from tests.storage.reviewer.conftest import EXPERIMENT, PRINCIPALS, World

ENDPOINTS = {
    "decisions": "/v1/reviewer/decisions?limit=3",
    "request": "/v1/reviewer/requests/rv-1",
    "experiments": "/v1/reviewer/experiments",
    "events": f"/v1/reviewer/experiments/{EXPERIMENT}/versions/1/events",
}


def _log_since(world: World, access_id: int) -> list[Any]:
    with world.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT principal, role, endpoint, parameters, rows_returned, outcome, at"
                " FROM reviewer_access_log WHERE access_id > :a ORDER BY access_id"
            ),
            {"a": access_id},
        ).all()


def _last_id(world: World) -> int:
    with world.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT coalesce(max(access_id), 0) FROM reviewer_access_log")
            ).scalar_one()
        )


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_only_reviewer_and_admin_may_read(world: World, endpoint: str) -> None:
    got = {}
    for caller in ("reviewer", "admin", "runtime", "safety"):
        with world.client(caller) as http:
            got[caller] = http.get(ENDPOINTS[endpoint]).status_code
    with httpx.Client(base_url=world.base) as http:
        got["none"] = http.get(ENDPOINTS[endpoint]).status_code
        got["wrong"] = http.get(
            ENDPOINTS[endpoint], headers={"authorization": "Bearer nope"}
        ).status_code
    assert got == {
        "reviewer": 200,
        "admin": 200,
        "runtime": 403,
        "safety": 403,
        "none": 401,
        "wrong": 401,
    }


def test_every_query_is_in_the_access_log_with_what_it_returned(world: World) -> None:
    value = world.service.metrics.registry.get_sample_value

    def counted(endpoint: str, result: str) -> float:
        labels = {"endpoint": endpoint, "result": result}
        return value("understudy_reviewer_queries_total", labels) or 0.0

    start = _last_id(world)
    before = {
        k: counted(*k)
        for k in (
            ("decisions", "ok"),
            ("decisions", "rejected"),
            ("request", "not_found"),
            ("events", "denied"),
        )
    }
    with world.client() as http:
        page = http.get("/v1/reviewer/decisions", params={"policy": "best-fit", "limit": 4}).json()
        full = http.get("/v1/reviewer/requests/rv-3")
        missing = http.get("/v1/reviewer/requests/rv-none")
        rejected = http.get("/v1/reviewer/decisions", params={"status": "maybe"})
        experiments = http.get("/v1/reviewer/experiments").json()
    with world.client("admin") as http:
        events = http.get(f"/v1/reviewer/experiments/{EXPERIMENT}/versions/1/events").json()
    with world.client("runtime") as http:
        denied = http.get(f"/v1/reviewer/experiments/{EXPERIMENT}/versions/1/events")
    assert (full.status_code, missing.status_code) == (200, 404)
    assert (rejected.status_code, denied.status_code) == (400, 403)

    rows = _log_since(world, start)
    assert [(r.principal, r.role, r.endpoint, r.outcome) for r in rows] == [
        (PRINCIPALS["reviewer"], "reviewer", "decisions", "ok"),
        (PRINCIPALS["reviewer"], "reviewer", "request", "ok"),
        (PRINCIPALS["reviewer"], "reviewer", "request", "not_found"),
        (PRINCIPALS["reviewer"], "reviewer", "decisions", "rejected"),
        (PRINCIPALS["reviewer"], "reviewer", "experiments", "ok"),
        (PRINCIPALS["admin"], "admin", "events", "ok"),
        (PRINCIPALS["runtime"], "runtime", "events", "denied"),
    ]
    assert [r.parameters for r in rows] == [
        {"policy": "best-fit", "limit": "4"},
        {"request_id": "rv-3"},
        {"request_id": "rv-none"},
        {"status": "maybe"},
        {},
        {"protocol_id": EXPERIMENT, "version": "1"},
        {"protocol_id": EXPERIMENT, "version": "1"},
    ]
    assert [r.rows_returned for r in rows] == [
        len(page["items"]),
        1,
        0,
        0,
        len(experiments),
        len(events),
        0,
    ]
    assert len(page["items"]) == 4 and len(events) == 2
    assert rows == sorted(rows, key=lambda r: r.at)
    assert counted("decisions", "ok") == before["decisions", "ok"] + 1
    assert counted("decisions", "rejected") == before["decisions", "rejected"] + 1
    assert counted("request", "not_found") == before["request", "not_found"] + 1
    assert counted("events", "denied") == before["events", "denied"] + 1


def test_openapi_documents_every_reviewer_endpoint(world: World) -> None:
    with world.client() as http:
        document = http.get("/openapi.json").json()
    paths = document["paths"]
    assert {
        "/v1/reviewer/decisions",
        "/v1/reviewer/requests/{request_id}",
        "/v1/reviewer/experiments",
        "/v1/reviewer/experiments/{protocol_id}/versions/{version}/events",
    } <= set(paths)
    decisions = paths["/v1/reviewer/decisions"]["get"]
    assert decisions["summary"]
    described = {p["name"]: p.get("description", "") for p in decisions["parameters"]}
    assert set(described) == set(DECISION_PARAMETER_DOCS)
    assert all(described.values())
    content = decisions["responses"]["200"]["content"]
    assert {"application/json", "text/csv"} <= set(content)
    assert content["application/json"]["schema"]["$ref"].endswith("DecisionPageModel")
    for path in paths:
        if path.startswith("/v1/reviewer/"):
            operation = paths[path]["get"]
            assert operation["summary"] and {"200", "400", "401", "403"} <= set(
                operation["responses"]
            ), path
