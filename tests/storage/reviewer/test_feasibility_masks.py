"""The per-option feasibility bits: logged once per request by the running scorer, shown by the
reviewer API over HTTP in JSON and CSV, and "not logged" for a row from before migration 0010.

Ground truth is `check_feasibility` called on the requests the test sent
(kept in memory), and direct SQL on ``requests`` as the service's role.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psycopg
import pytest
from sqlalchemy import text

from service.auth import token_digest
from service.cli.demo_view import MASKS_SHOWN, mask_lines
from service.contract import MirrorRequest, check_feasibility
from service.contract.feasibility import FEASIBILITY_VERSION, SIGNALS
from service.server.app import build_service
from service.settings import Settings
from service.storage import (
    DecisionLogWriter,
    EmbeddedPostgres,
    count_decisions,
    create_database,
    drop_database,
)
from service.storage.log.masks import SIGNALS_BY_VERSION, logged_mask
from service.transport.http.convert import mirror_to_json
from tests.live_traffic import wait_for
from tests.pg_fixtures import TEMPLATE
from tests.storage.reviewer.conftest import PRINCIPALS, TOKENS, World
from tests.storage.storage_helpers import request_batch

_names = itertools.count()


@pytest.fixture(scope="module")
def world(pg_server: EmbeddedPostgres, requests_sample: list[MirrorRequest]) -> Iterator[World]:
    """A running service (HTTP + the scorer, whatever policies load) that scored the sample.

    Lighter than the package's `world`: no experiment is started, so these checks do not
    depend on which learned policies the current feature version registers.
    """
    database = f"masks_{next(_names)}"
    url = create_database(pg_server.url(), database, template=TEMPLATE)
    data_dir = Path(tempfile.mkdtemp(prefix="understudy-masks-"))
    roles = ("reviewer", "runtime")
    settings = Settings(
        database_url=url,
        data_dir=data_dir,
        grpc_port=0,
        http_port=0,
        auth_tokens={token_digest(TOKENS[r]): f"{r}:{PRINCIPALS[r]}" for r in roles},
        journal_fsync="never",
        evaluator_enabled=False,
    )
    service = build_service(settings)
    service.start()
    service.wait_started()
    try:
        assert service.engine is not None and service.policies is not None
        engine = service.engine
        requests = [
            dataclasses.replace(r, request_id=f"mask-{i}") for i, r in enumerate(requests_sample)
        ]
        runtime = {"authorization": f"Bearer {TOKENS['runtime']}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as http:
            for r in requests:
                ack = http.post("/v1/mirror", content=mirror_to_json(r), headers=runtime)
                assert ack.json()["status"] == "accepted", ack.text
        n_policies = len(service.policies.policies)
        wait_for(lambda: count_decisions(engine) == len(requests) * n_policies, "scoring")
        yield World(
            service=service,
            engine=engine,
            url=url,
            database=database,
            server=pg_server,
            sent={r.request_id: r for r in requests},
            with_outcome=frozenset(),
            n_policies=n_policies,
        )
    finally:
        service.stop(grace=0.5)
        drop_database(pg_server.url(), database)
        shutil.rmtree(data_dir, ignore_errors=True)


def _expected(world: World, request_id: str) -> list[list[str]]:
    r = world.sent[request_id]
    f = check_feasibility(r.state, r.workload, r.options, r.quota_remaining)
    return [[s.value for s in f.failed(i)] for i in range(r.options.n_options)]


def test_the_current_version_reads_with_todays_signals() -> None:
    assert SIGNALS_BY_VERSION[FEASIBILITY_VERSION] == tuple(s.value for s in SIGNALS)
    assert len(SIGNALS) <= 16  # one uint16 per option


def test_the_scorer_logs_check_feasibilitys_bits_for_every_request(world: World) -> None:
    with world.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT request_id, feasibility_version, feasibility_bits, qos_class FROM requests"
            )
        ).all()
    logged = {r.request_id: r for r in rows if r.request_id in world.sent}
    assert set(logged) == set(world.sent)
    masked = 0
    for request_id, r in world.sent.items():
        f = check_feasibility(r.state, r.workload, r.options, r.quota_remaining)
        row = logged[request_id]
        assert row.feasibility_version == f.version
        assert bytes(row.feasibility_bits) == f.bits.astype("<u2").tobytes(), request_id
        assert row.qos_class == r.workload.qos_class
        mask = logged_mask(row.feasibility_version, row.feasibility_bits)
        assert [list(mask.signals(i) or ()) for i in range(r.options.n_options)] == [
            [s.value for s in f.failed(i)] for i in range(r.options.n_options)
        ]
        masked += int((f.bits != 0).sum())
    assert masked > 0  # the sample has masked options, so the check compares real bits


def test_json_shows_each_options_mask_and_that_it_matches_a_replay(world: World) -> None:
    request_id = sorted(world.sent)[3]
    r = world.sent[request_id]
    with world.client() as http:
        body = http.get(f"/v1/reviewer/requests/{request_id}/feasibility").json()
        full = http.get(f"/v1/reviewer/requests/{request_id}").json()
    assert body["status"] == "logged" and body["matches_replay"] is True
    assert full["logged_feasibility"] == body
    expected = _expected(world, request_id)
    assert [o["signals"] for o in body["options"]] == expected
    assert [o["feasible"] for o in body["options"]] == [not e for e in expected]
    first = body["options"][0]
    assert first["nodes"] == [r.state.node_ids[int(n)] for n in r.options.nodes_of(0)]
    assert any(len(e) > 1 for rid in world.sent for e in _expected(world, rid))


def test_csv_is_one_flat_row_per_option_with_joined_signals(world: World) -> None:
    request_id = sorted(world.sent)[5]
    with world.client() as http:
        response = http.get(
            f"/v1/reviewer/requests/{request_id}/feasibility", params={"format": "csv"}
        )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    expected = _expected(world, request_id)
    assert len(rows) == len(expected)
    assert [r["signals"].split(";") if r["signals"] else [] for r in rows] == expected
    assert [r["feasible"] for r in rows] == ["false" if e else "true" for e in expected]
    assert {r["request_id"] for r in rows} == {request_id}
    assert {r["status"] for r in rows} == {"logged"}


def test_a_row_logged_before_0010_says_not_logged(world: World) -> None:
    """A request row without bits (what the writer stored before 0010) reads as not logged,
    while the replayed mask of the request in full is still there."""
    base = world.sent[sorted(world.sent)[0]]
    old = dataclasses.replace(base, request_id="before-0010", request_time=base.request_time + 1)
    DecisionLogWriter(world.engine).write(request_batch([old], first_seq=10_000))
    with world.engine.connect() as conn:
        stored = conn.execute(
            text("SELECT feasibility_bits FROM requests WHERE request_id = 'before-0010'")
        ).scalar_one()
    assert stored is None
    with world.client() as http:
        body = http.get("/v1/reviewer/requests/before-0010/feasibility").json()
        full = http.get("/v1/reviewer/requests/before-0010").json()
        lines = http.get(
            "/v1/reviewer/requests/before-0010/feasibility", params={"format": "csv"}
        ).text
    assert body["status"] == "not logged" and body["version"] is None
    assert body["matches_replay"] is None
    assert all(o["feasible"] is None and o["signals"] is None for o in body["options"])
    replayed = check_feasibility(old.state, old.workload, old.options, old.quota_remaining)
    assert [o["feasible"] for o in full["options"]] == replayed.mask.tolist()
    rows = list(csv.DictReader(io.StringIO(lines)))
    assert {r["status"] for r in rows} == {"not logged"} and {r["feasible"] for r in rows} == {""}


def test_a_bad_format_is_a_400_naming_it(world: World) -> None:
    request_id = sorted(world.sent)[0]
    with world.client() as http:
        bad = http.get(f"/v1/reviewer/requests/{request_id}/feasibility", params={"format": "x"})
        extra = http.get(f"/v1/reviewer/requests/{request_id}/feasibility", params={"n": "1"})
        missing = http.get("/v1/reviewer/requests/nope/feasibility")
    assert bad.status_code == 400 and "format" in bad.text
    assert extra.status_code == 400 and "`n`" in extra.text
    assert missing.status_code == 404
    path = f"/v1/reviewer/requests/{request_id}/feasibility"
    with world.client("runtime") as http:
        assert http.get(path).status_code == 403  # reviewer and admin roles only
    assert httpx.get(world.base + path, timeout=30).status_code == 401


def test_unpacking_refuses_a_torn_blob() -> None:
    with pytest.raises(ValueError, match="whole number"):
        logged_mask("feasibility-v1", b"\x01")
    unknown = logged_mask("feasibility-v9", np.array([3], dtype="<u2").tobytes())
    assert unknown.status == "unknown version feasibility-v9" and unknown.signals(0) is None


def test_the_views_show_the_bits_and_name_each_options_signals(world: World) -> None:
    """As the reviewer role: reviewer_decisions carries the request's bits, and
    reviewer_option_feasibility one row per option with the signal names."""
    request_id = sorted(world.sent)[7]
    with psycopg.connect(world.reviewer_conninfo()) as conn:
        per_option = conn.execute(
            "SELECT option, bits, feasible, signals FROM reviewer_option_feasibility "
            "WHERE request_id = %s ORDER BY option",
            (request_id,),
        ).fetchall()
        decisions = conn.execute(
            "SELECT DISTINCT feasibility_version, feasibility_bits, qos_class "
            "FROM reviewer_decisions WHERE request_id = %s",
            (request_id,),
        ).fetchall()
        (migrated,) = conn.execute(
            "SELECT count(*) FROM reviewer_option_feasibility WHERE request_id = 'before-0010'"
        ).fetchall()
    r = world.sent[request_id]
    f = check_feasibility(r.state, r.workload, r.options, r.quota_remaining)
    assert [row[0] for row in per_option] == list(range(r.options.n_options))
    assert [row[1] for row in per_option] == f.bits.tolist()
    assert [row[2] for row in per_option] == f.mask.tolist()
    assert [row[3] for row in per_option] == _expected(world, request_id)
    assert decisions == [(f.version, f.bits.astype("<u2").tobytes(), r.workload.qos_class)]
    assert migrated == (0,)  # no bits, no rows: a request from before 0010


def test_the_migration_names_the_signals_the_code_does() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "migrations" / "versions"
    spec = importlib.util.spec_from_file_location("m0012", path / "0012_feasibility_views.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SIGNALS == SIGNALS_BY_VERSION


def test_the_demos_closing_lines_name_masked_options_from_the_api(world: World) -> None:
    ids = sorted(world.sent)
    lines = mask_lines(world.base, TOKENS["reviewer"], ids)

    first = next(i for i in ids if any(_expected(world, i)))
    r = world.sent[first]
    masked = [(i, s) for i, s in enumerate(_expected(world, first)) if s]
    assert first in lines[0] and f"{len(masked)} of {r.options.n_options} options" in lines[0]
    assert len(lines) == 1 + min(len(masked), MASKS_SHOWN)
    for line, (i, signals) in zip(lines[1:], masked, strict=False):
        nodes = ", ".join(r.state.node_ids[int(n)] for n in r.options.nodes_of(i))
        assert line.strip().startswith(f"option {i} (node")
        assert line.endswith(f"{nodes}): masked by {', '.join(signals)}")
