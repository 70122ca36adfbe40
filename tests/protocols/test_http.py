"""The protocol routes under a real uvicorn: roles, independent approval, the lock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.protocols import content_hash, parse_protocol
from tests.protocols.conftest import unique


@pytest.fixture()
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=10) as client:
        yield client


def auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def submitted(http: httpx.Client, doc: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/protocols", json={"document": doc}, headers=auth("alice-admin"))
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    assert body["state"] == "draft"
    return body


def path(doc: dict[str, Any], verb: str = "") -> str:
    return f"/v1/protocols/{doc['id']}/versions/{doc['version']}" + (f"/{verb}" if verb else "")


@pytest.mark.parametrize(
    ("token", "status"),
    [
        ("dave-safety", 200),  # safety, not an owner: the only way in
        ("alice-safety", 403),  # an owner holding the safety role
        ("alice-admin", 403),
        ("root-admin", 403),  # admin, even one who owns nothing
        ("rita-reviewer", 403),
        ("rt-runtime", 403),
        (None, 401),
        ("forged", 401),
    ],
)
def test_only_an_independent_safety_holder_can_approve(
    token: str | None, status: int, http: httpx.Client, online_doc: dict[str, Any]
) -> None:
    doc = unique(online_doc)
    record = submitted(http, doc)
    body = {"content_sha256": record["content_sha256"], "reason": "bounds reviewed"}
    response = http.post(path(doc, "approve"), json=body, headers=auth(token))
    assert response.status_code == status, response.text
    start = http.post(path(doc, "start"), json={"reason": "go"}, headers=auth("alice-admin"))
    if status == 200:
        assert response.json()["state"] == "approved"
        assert start.status_code == 200 and start.json()["state"] == "running"
    else:
        assert response.json()["error"] in ("PermissionDenied", "Unauthenticated")
        assert start.status_code == 409  # an unapproved online protocol cannot start
        assert "only after approval by the `safety` role" in start.json()["message"]
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"
    events = http.get(path(doc), headers=auth("rita-reviewer")).json()["events"]
    assert [e["action"] for e in events] == (
        ["submit", "approve", "start"] if status == 200 else ["submit"]
    )


def test_a_changed_running_protocol_is_refused_over_http(
    http: httpx.Client, shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    started = http.post(
        path(doc, "start"), json={"reason": "go", "document": doc}, headers=auth("alice-admin")
    )
    assert started.status_code == 200, started.text
    changed = {**doc, "stop": [dict(s) for s in doc["stop"]]}
    changed["stop"][1]["worse_than"] = 0.5
    again = http.post(
        path(doc, "start"), json={"reason": "go", "document": changed}, headers=auth("alice-admin")
    )
    assert again.status_code == 409
    assert again.json()["error"] == "ProtocolLocked"
    assert "`stop[1].worse_than`" in again.json()["message"]


def test_validate_answers_with_findings_and_the_lock_hash(
    http: httpx.Client, shadow_doc: dict[str, Any]
) -> None:
    ok = http.post(
        "/v1/protocols/validate", json={"document": shadow_doc}, headers=auth("rita-reviewer")
    )
    assert ok.status_code == 200
    assert ok.json()["valid"] is True
    assert ok.json()["content_sha256"] == content_hash(parse_protocol(shadow_doc))
    bad = {**shadow_doc, "alpha": 2}
    refused = http.post(
        "/v1/protocols/validate", json={"document": bad}, headers=auth("rita-reviewer")
    )
    assert refused.json()["valid"] is False
    assert refused.json()["findings"][0]["field"] == "alpha"
    wrong_sha = {**shadow_doc, "candidate": {**shadow_doc["candidate"], "sha256": "0" * 64}}
    checked = http.post(
        "/v1/protocols/validate", json={"document": wrong_sha}, headers=auth("dave-safety")
    )
    assert [f["field"] for f in checked.json()["findings"]] == ["candidate.sha256"]
    runtime = http.post(
        "/v1/protocols/validate", json={"document": shadow_doc}, headers=auth("rt-runtime")
    )
    assert runtime.status_code == 403


@pytest.mark.parametrize(
    ("token", "status"),
    [("alice-admin", 201), ("root-admin", 403), ("dave-safety", 403), (None, 401)],
)
def test_only_an_owner_with_admin_submits(
    token: str | None, status: int, http: httpx.Client, shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    response = http.post("/v1/protocols", json={"document": doc}, headers=auth(token))
    assert response.status_code == status, response.text


def test_stop_status_and_listing(http: httpx.Client, shadow_doc: dict[str, Any]) -> None:
    doc = unique(shadow_doc)
    http.post(
        path(doc, "start"), json={"reason": "go", "document": doc}, headers=auth("alice-admin")
    )
    reviewer = http.post(path(doc, "stop"), json={"reason": "no"}, headers=auth("rita-reviewer"))
    assert reviewer.status_code == 403
    stopped = http.post(path(doc, "stop"), json={"reason": "harm"}, headers=auth("dave-safety"))
    assert stopped.json()["state"] == "stopped"
    status = http.get(path(doc), headers=auth("rita-reviewer")).json()
    assert [(e["action"], e["actor"], e["reason"]) for e in status["events"]][-1] == (
        "stop",
        "dave",
        "harm",
    )
    assert status["record"]["document"]["id"] == doc["id"]
    listed = http.get("/v1/protocols", params={"state": "stopped"}, headers=auth("rita-reviewer"))
    assert doc["id"] in [r["protocol_id"] for r in listed.json()]
    again = http.post(path(doc, "stop"), json={"reason": "twice"}, headers=auth("dave-safety"))
    assert again.status_code == 409


@pytest.mark.parametrize(
    ("url", "body", "status", "field"),
    [
        ("/v1/protocols/x/versions/1/stop", {}, 400, "reason"),
        ("/v1/protocols/x/versions/1/stop", {"reason": "r", "extra": 1}, 400, "extra"),
        ("/v1/protocols/x/versions/one/stop", {"reason": "r"}, 400, "version"),
        (
            "/v1/protocols/x/versions/1/approve",
            {"content_sha256": "abc", "reason": "r"},
            400,
            "content_sha256",
        ),
        ("/v1/protocols/x/versions/1/stop", {"reason": "r"}, 404, None),
        ("/v1/protocols/x/versions/1/stop", {"reason": "  "}, 400, "reason"),
    ],
)
def test_bad_requests_name_the_field(
    url: str, body: dict[str, Any], status: int, field: str | None, http: httpx.Client
) -> None:
    response = http.post(url, json=body, headers=auth("dave-safety"))
    assert response.status_code == status, response.text
    assert response.json()["field"] == field


def test_bodies_are_bounded(http: httpx.Client) -> None:
    huge = {"document": {"hypothesis": "x" * (1024 * 1024)}}
    response = http.post("/v1/protocols/validate", json=huge, headers=auth("rita-reviewer"))
    assert response.status_code == 413
    listed = http.get("/v1/protocols", params={"state": "paused"}, headers=auth("rita-reviewer"))
    assert listed.status_code == 400 and listed.json()["field"] == "state"
