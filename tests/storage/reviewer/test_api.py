"""The reviewer API on a live service: filters against the log, pages, CSV, one request in full.

Ground truth comes from outside the code under test: the requests the test
sent (kept in memory), direct SQL on the base tables as the service's role,
and the feature and feasibility functions called on the in-memory requests.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from service.contract import DEFAULT_FEATURES, check_feasibility
from service.storage import DecisionLogWriter, LogBatch, decisions_for
from service.transport.http.convert import mirror_to_json
from tests.storage.reviewer.conftest import EXPERIMENT, World
from tests.storage.storage_helpers import decisions_of


def _get(http: httpx.Client, path: str = "/v1/reviewer/decisions", **params: Any) -> Any:
    response = http.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _all(http: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = _get(http, **params, **({"cursor": cursor} if cursor else {}))
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def _sql_keys(world: World, where: str, **params: Any) -> set[tuple[str, str]]:
    query = (
        "SELECT d.request_id, d.policy_name FROM decisions d JOIN requests r"
        " ON r.request_id = d.request_id AND r.request_time = d.request_time WHERE " + where
    )
    with world.engine.connect() as conn:
        return {(a, b) for a, b in conn.execute(text(query), params)}


def _keys(items: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(i["request_id"], i["policy_name"]) for i in items}


@pytest.mark.parametrize(
    ("params", "where", "binds"),
    [
        ({"policy": "gavel-scorer"}, "d.policy_name = :p", {"p": "gavel-scorer"}),
        ({"status": "ok"}, "d.status = 'ok'", {}),
        ({"workload_kind": "infer"}, "r.workload_kind = 'infer'", {}),
        ({"disagreement": "true"}, "d.agrees_with_production IS FALSE", {}),
        ({"disagreement": "false"}, "d.agrees_with_production IS TRUE", {}),
        (
            {"since": "1700000006", "until": "2023-11-14T22:13:50Z"},
            "d.request_time >= to_timestamp(1700000006)"
            " AND d.request_time < to_timestamp(1700000030)",
            {},
        ),
        (
            {"policy": "first-fit", "workload_kind": "batch", "disagreement": "true"},
            "d.policy_name = 'first-fit' AND r.workload_kind = 'batch'"
            " AND d.agrees_with_production IS FALSE",
            {},
        ),
    ],
)
def test_filters_select_what_sql_on_the_base_tables_selects(
    world: World, params: dict[str, str], where: str, binds: dict[str, Any]
) -> None:
    expected = _sql_keys(world, where, **binds)
    assert expected, "the filter must select something for the test to mean anything"
    with world.client() as http:
        got = _all(http, **params, limit=7)
    assert len(got) == len(expected)
    assert _keys(got) == expected


def test_experiment_filter_is_the_candidate_inside_the_window(world: World) -> None:
    with world.client() as http:
        experiment = _get(http, "/v1/reviewer/experiments")[0]
        got = _all(http, experiment=EXPERIMENT, limit=50)
        assert _get(http, experiment=EXPERIMENT, experiment_version="1")["items"] == got[:100]
        unknown = http.get("/v1/reviewer/decisions", params={"experiment": "no-such"})
    assert experiment["protocol_id"] == EXPERIMENT and experiment["started_at"] is not None
    assert {(i["policy_name"], i["policy_version"]) for i in got} == {("gavel-scorer", "1.0.0")}
    assert {i["request_id"] for i in got} == set(world.sent)  # all mirrored after the start
    assert all(i["received_at"] >= experiment["started_at"] for i in got)
    assert unknown.status_code == 404 and "no-such" in unknown.json()["message"]


def test_hardware_class_filter_matches_the_chosen_option_of_the_sent_request(
    world: World,
) -> None:
    expected: set[tuple[str, str]] = set()
    for request_id, sent in world.sent.items():
        for d in decisions_for(world.engine, request_id):
            if 0 <= d.chosen_option < sent.options.n_options:
                nodes = sent.options.nodes_of(d.chosen_option)
                if "V100" in {sent.state.hardware_of(int(n)).name for n in nodes}:
                    expected.add((request_id, d.policy_name))
    assert expected
    with world.client() as http:
        got = _all(http, hardware_class="V100", limit=3)
    assert len(got) == len(expected)
    assert _keys(got) == expected


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_pages_return_every_row_once_even_with_inserts_between_pages(
    world: World, order: str
) -> None:
    policy = f"pager-{order}"
    requests = list(world.sent.values())
    writer = DecisionLogWriter(world.engine)
    writer.write(LogBatch(decisions=decisions_of(requests, policy=policy, version="1")))
    before = {(r.request_id, "1") for r in requests}
    seen: list[tuple[str, str]] = []
    times: list[tuple[float, str, str]] = []
    cursor = None
    pages = 0
    with world.client() as http:
        while True:
            params = {"policy": policy, "limit": 4, "order": order}
            page = _get(http, **params, **({"cursor": cursor} if cursor else {}))
            seen += [(i["request_id"], i["policy_version"]) for i in page["items"]]
            times += [
                (i["request_time"], i["request_id"], i["policy_version"]) for i in page["items"]
            ]
            pages += 1
            if pages in (1, 3):  # concurrent writers commit between pages
                rows = decisions_of(requests, policy=policy, version=str(pages + 1), seed=pages)
                writer.write(LogBatch(decisions=rows))
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert len(seen) == len(set(seen)), "a row came back twice"
    assert before <= set(seen), "a row that existed before paging was skipped"
    assert times == sorted(times, reverse=order == "desc")
    assert pages > len(before) // 4


def test_csv_parses_and_matches_json(world: World) -> None:
    params = {"policy": "gavel-scorer", "limit": "25"}
    with world.client() as http:
        as_json = _get(http, **params)
        response = http.get("/v1/reviewer/decisions", params=params, headers={"accept": "text/csv"})
        by_param = http.get("/v1/reviewer/decisions", params=params | {"format": "csv"})
    assert response.headers["content-type"].startswith("text/csv")
    assert response.text == by_param.text
    assert response.headers["x-next-cursor"] == as_json["next_cursor"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    items = as_json["items"]
    assert len(rows) == len(items) == 25
    assert list(rows[0]) == list(items[0])
    for row, item in zip(rows, items, strict=True):
        for name, value in item.items():
            cell = row[name]
            if value is None:
                assert cell == "", name
            elif isinstance(value, bool):
                assert cell == ("true" if value else "false"), name
            elif isinstance(value, float):
                assert float(cell) == value, name
            elif isinstance(value, int):
                assert int(cell) == value, name
            else:
                assert cell == value, name


def test_experiments_and_events_as_csv(world: World) -> None:
    with world.client() as http:
        events = _get(http, f"/v1/reviewer/experiments/{EXPERIMENT}/versions/1/events")
        text_ = http.get(
            f"/v1/reviewer/experiments/{EXPERIMENT}/versions/1/events", params={"format": "csv"}
        ).text
        experiments = list(
            csv.DictReader(io.StringIO(http.get("/v1/reviewer/experiments?format=csv").text))
        )
    rows = list(csv.DictReader(io.StringIO(text_)))
    assert [e["action"] for e in events] == ["submit", "start"]
    assert [r["action"] for r in rows] == ["submit", "start"]
    assert [json.loads(r["evidence"]) for r in rows] == [e["evidence"] for e in events]
    assert [e["protocol_id"] for e in experiments] == [EXPERIMENT]


def test_one_request_in_full_is_what_was_sent_replayed(world: World) -> None:
    request_id = sorted(world.with_outcome)[0]
    sent = world.sent[request_id]
    with world.client() as http:
        full = _get(http, f"/v1/reviewer/requests/{request_id}")
        pending = _get(
            http, f"/v1/reviewer/requests/{sorted(set(world.sent) - world.with_outcome)[0]}"
        )
    assert full["request"] == json.loads(mirror_to_json(sent))
    features = full["features"]
    recomputed = DEFAULT_FEATURES(sent.state, sent.workload, sent.options)
    np.testing.assert_array_equal(np.asarray(features["values"], dtype=np.float32), recomputed)
    assert (
        features["same_definition"] and features["logged_hash"] == DEFAULT_FEATURES.definition_hash
    )
    assert features["names"] == list(DEFAULT_FEATURES.names)
    feasible = check_feasibility(sent.state, sent.workload, sent.options, sent.quota_remaining)
    assert [o["feasible"] for o in full["options"]] == feasible.mask.tolist()
    assert [o["nodes"] for o in full["options"]] == [
        [sent.state.node_ids[int(n)] for n in sent.options.nodes_of(i)]
        for i in range(sent.options.n_options)
    ]
    logged = {(d.policy_name, d.policy_version): d for d in decisions_for(world.engine, request_id)}
    assert {(d["policy_name"], d["policy_version"]) for d in full["decisions"]} == set(logged)
    for d in full["decisions"]:
        mine = logged[d["policy_name"], d["policy_version"]]
        assert d["chosen_option"] == mine.chosen_option
        assert len(d["scores"]) == len(d["probabilities"]) == sent.options.n_options
        expected = [None if np.isnan(p) else p for p in mine.probabilities.tolist()]
        assert d["probabilities"] == expected
    assert full["outcome"]["join_state"] == "after_request"
    assert full["outcome"]["throughput"] == 2.0
    assert [p["protocol_id"] for p in full["protocols"]] == [EXPERIMENT]
    assert pending["outcome"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "maybe"}, "status"),
        ({"status": "OK"}, "status"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-05-01T00:00:00"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"until": "nan"}, "until"),
        ({"since": "1e400"}, "since"),
        ({"since": "1700000010", "until": "1700000000"}, "until"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "²"}, "limit"),
        ({"cursor": "not a cursor!"}, "cursor"),
        ({"cursor": "eyJ2IjoyfQ"}, "cursor"),
        ({"workload_kind": "training"}, "workload_kind"),
        ({"disagreement": "perhaps"}, "disagreement"),
        ({"order": "sideways"}, "order"),
        ({"format": "xml"}, "format"),
        ({"experiment_version": "0"}, "experiment_version"),
        ({"experiment_version": "2"}, "experiment_version"),
        ({"colour": "red"}, "colour"),
        ({"policy": ""}, "policy"),
    ],
)
def test_bad_values_are_400_naming_the_field(
    world: World, params: dict[str, str], field: str
) -> None:
    value = world.service.metrics.registry.get_sample_value
    labels = {"endpoint": "decisions", "result": "rejected"}
    before = value("understudy_reviewer_queries_total", labels) or 0.0
    with world.client() as http:
        response = http.get("/v1/reviewer/decisions", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field
    assert value("understudy_reviewer_queries_total", labels) == before + 1


def test_a_cursor_is_refused_with_other_filters_or_order(world: World) -> None:
    with world.client() as http:
        cursor = _get(http, policy="gavel-scorer", limit=2)["next_cursor"]
        other = http.get("/v1/reviewer/decisions", params={"policy": "best-fit", "cursor": cursor})
        flipped = http.get(
            "/v1/reviewer/decisions",
            params={"policy": "gavel-scorer", "order": "desc", "cursor": cursor},
        )
        twice = http.get("/v1/reviewer/decisions?status=ok&status=error")
    assert (other.status_code, other.json()["field"]) == (400, "cursor")
    assert (flipped.status_code, flipped.json()["field"]) == (400, "cursor")
    assert (twice.status_code, twice.json()["field"]) == (400, "status")


def test_unknown_objects_are_404(world: World) -> None:
    with world.client() as http:
        assert http.get("/v1/reviewer/requests/no-such-request").status_code == 404
        assert (
            http.get(f"/v1/reviewer/experiments/{EXPERIMENT}/versions/9/events").status_code == 404
        )
        bad = http.get(f"/v1/reviewer/experiments/{EXPERIMENT}/versions/one/events")
    assert (bad.status_code, bad.json()["field"]) == (400, "version")


def test_listings_refuse_unknown_parameters(world: World) -> None:
    with world.client() as http:
        experiments = http.get("/v1/reviewer/experiments", params={"colour": "red"})
        events = http.get(
            f"/v1/reviewer/experiments/{EXPERIMENT}/versions/1/events", params={"since": "1"}
        )
        one = http.get("/v1/reviewer/experiments", params={"protocol_id": EXPERIMENT})
    assert (experiments.status_code, experiments.json()["field"]) == (400, "colour")
    assert (events.status_code, events.json()["field"]) == (400, "since")
    assert [e["protocol_id"] for e in one.json()] == [EXPERIMENT]
