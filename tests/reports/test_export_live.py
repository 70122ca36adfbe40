"""`understudy export` and `understudy ope --parquet` on a log made through the real service.

The log is built once for the module the way ``test_live_log`` builds it: the
demo's simulated Runtime mirrors through the real `MirrorClient`, the
committed policies score, outcomes join in the embedded PostgreSQL.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pytest
import vowpalwabbit
from typer.testing import CliRunner

from service.auth import token_digest
from service.cli.demo import simulated_runtime
from service.cli.evaluation import evaluation_app
from service.cli.export import export_app
from service.cli.main import app as understudy
from service.contract import Outcome
from service.ope import Estimator
from service.reports.ope.arrays import Reward
from service.reports.ope.ope_run import run_ope
from service.reports.ope.parquet_ope import stream_ope
from service.reports.ope.parquet_source import read_parquet_log
from service.reports.ope.summary import report_json
from service.server.app import build_service
from service.settings import Settings
from service.storage import EmbeddedPostgres, create_database, drop_database, make_engine
from service.storage.export.parquet import SCHEMA_KEY, SCHEMA_VERSION, export_parquet
from service.storage.reads.ope import OpeFilter, OpeLog, read_ope_log
from tests.live_traffic import send_events
from tests.pg_fixtures import TEMPLATE
from tests.reports.test_live_log import _logged


@dataclass(frozen=True)
class LiveLog:
    url: str
    outcomes: int


@pytest.fixture(scope="module")
def live_log(
    pg_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveLog]:
    """Four simulated episodes mirrored, scored and joined in a database of this module's own."""
    name = f"export_{secrets.token_hex(4)}"
    url = create_database(pg_server.url(), name, template=TEMPLATE)
    token = secrets.token_urlsafe(16)
    settings = Settings(
        database_url=url,
        data_dir=tmp_path_factory.mktemp("export-service"),
        grpc_port=0,
        http_port=0,
        auth_tokens={token_digest(token): "runtime"},
        journal_fsync="never",
    )
    service = build_service(settings)
    service.start()
    service.wait_started()
    try:
        events = simulated_runtime(episodes=4, seed=0)
        outcomes = sum(isinstance(e, Outcome) for e in events)
        send_events(service, token, events)
        _logged(service, outcomes)
    finally:
        service.stop(grace=0.5)
    yield LiveLog(url, outcomes)
    drop_database(pg_server.url(), name)


def assert_same(live: Any, other: Any, path: str = "") -> None:
    """Equal JSON trees, floats to 1e-9 (relative) / 1e-12 (absolute)."""
    if isinstance(live, dict):
        assert set(live) == set(other), (path, set(live) ^ set(other))
        for key in live:
            assert_same(live[key], other[key], f"{path}/{key}")
    elif isinstance(live, list):
        assert len(live) == len(other), path
        for i, (a, b) in enumerate(zip(live, other, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(live, float) and isinstance(other, float):
        assert math.isclose(live, other, rel_tol=1e-9, abs_tol=1e-12), (path, live, other)
    else:
        assert live == other, (path, live, other)


def live_report(url: str, where: OpeFilter) -> tuple[OpeLog, dict[str, Any]]:
    engine = make_engine(url)
    try:
        log = read_ope_log(engine, where)
    finally:
        engine.dispose()
    return log, report_json(run_ope(log))


def export(url: str, where: OpeFilter, out: Path, batch_rows: int = 20_000) -> None:
    engine = make_engine(url)
    try:
        export_parquet(engine, where, out, batch_rows=batch_rows)
    finally:
        engine.dispose()


def midpoint(url: str) -> float:
    log, _ = live_report(url, OpeFilter())
    return float(np.median(log.received_at))


def test_ope_on_the_exported_slice_equals_ope_on_the_live_log(
    live_log: LiveLog, tmp_path: Path
) -> None:
    whole = OpeFilter()
    narrow = OpeFilter(
        since=midpoint(live_log.url),
        policies=("lcb-planner", "gavel-scorer", "first-fit"),
        workload_kind="train",
    )
    export(live_log.url, whole, tmp_path / "all")
    for where in (whole, narrow):
        log, live = live_report(live_log.url, where)
        assert log.n > 100 and live["policies"]
        export(live_log.url, where, tmp_path / f"slice-{len(where.policies)}")
        streamed = report_json(stream_ope(tmp_path / f"slice-{len(where.policies)}"))
        assert_same(live, streamed)
        # the same filter applied to the whole exported log, on the Parquet side
        assert_same(live, report_json(stream_ope(tmp_path / "all", where)))
        rebuilt = read_parquet_log(tmp_path / "all", where)
        assert_same(live, report_json(run_ope(rebuilt)))
        assert (rebuilt.request_id == log.request_id).all()
    # another reward and a self-normalised primary estimator
    options = {"reward": Reward.NEG_COMPLETION_HOURS, "primary": Estimator.SNIPS, "level": 0.9}
    log, _ = live_report(live_log.url, narrow)
    live = report_json(run_ope(log, **options))  # type: ignore[arg-type]
    assert_same(live, report_json(stream_ope(tmp_path / "all", narrow, **options)))  # type: ignore[arg-type]


def test_batch_size_changes_nothing(live_log: LiveLog, tmp_path: Path) -> None:
    export(live_log.url, OpeFilter(), tmp_path / "small", batch_rows=37)
    export(live_log.url, OpeFilter(), tmp_path / "large", batch_rows=100_000)
    tables = [
        ds.dataset(tmp_path / name, partitioning="hive")
        .to_table()
        .sort_by([("seq", "ascending"), ("policy", "ascending")])
        for name in ("small", "large")
    ]
    assert tables[0].num_rows > 1000
    assert tables[0].equals(tables[1])
    tiny = report_json(stream_ope(tmp_path / "small", batch_rows=61))
    whole = report_json(stream_ope(tmp_path / "small", batch_rows=1_000_000))
    assert_same(whole, tiny)


def test_the_slice_carries_its_schema_version_and_partitions(
    live_log: LiveLog, tmp_path: Path
) -> None:
    export(live_log.url, OpeFilter(policies=("lcb-planner",)), tmp_path / "s")
    files = sorted((tmp_path / "s").rglob("*.parquet"))
    assert files and all(
        re.search(r"date=\d{4}-\d\d-\d\d/policy=lcb-planner/", str(f)) for f in files
    )
    schema = ds.dataset(files[0]).schema
    assert schema.metadata[SCHEMA_KEY] == SCHEMA_VERSION.encode()
    manifest = json.loads((tmp_path / "s" / "_slice.json").read_text())
    assert manifest["schema"] == SCHEMA_VERSION
    assert manifest["filter"]["policies"] == ["lcb-planner"]


def cli(app: Any, args: list[str], url: str) -> Any:
    env = {"UNDERSTUDY_DATABASE_URL": url, "COLUMNS": "200"}
    return CliRunner().invoke(app, args, env=env)


def test_dsjson_lines_parse_as_the_format_specifies(live_log: LiveLog, tmp_path: Path) -> None:
    out = tmp_path / "vw"
    result = cli(export_app, ["--out", str(out), "--format", "dsjson"], live_log.url)
    assert result.exit_code == 0, result.output
    log, _ = live_report(live_log.url, OpeFilter())
    by_id = {str(r): i for i, r in enumerate(log.request_id)}
    lines = (out / "slice.dsjson").read_text().splitlines()
    usable = ~np.isnan(log.slo_met) & (log.production_option != -2)
    assert len(lines) == int(usable.sum()) > 100
    workspace = vowpalwabbit.Workspace("--cb_explore_adf --dsjson --quiet")
    for line in lines:
        event = json.loads(line)
        i = by_id[event["EventId"]]
        k = int(log.n_options[i])
        column = k if log.production_option[i] == -1 else int(log.production_option[i])
        assert event["Version"] == "1"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", event["Timestamp"])
        assert event["_labelIndex"] == column and event["_label_Action"] == column + 1
        assert event["_label_cost"] == -log.slo_met[i]
        assert event["_label_probability"] == log.production_propensity[i] == event["p"][0]
        assert event["a"][0] == event["_label_Action"]
        assert sorted(event["a"]) == list(range(1, k + 2))
        assert len(event["c"]["_multi"]) == k + 1
        for decision in event["_understudy"]["policies"].values():
            if decision["p"] is not None:
                assert math.isclose(sum(decision["p"]), 1.0, abs_tol=1e-6)
        examples = workspace.parse(line)  # VW's own DSJSON parser
        assert len(examples) == k + 2  # the shared example, then one per action
        labels = [e.get_label(vowpalwabbit.LabelType.CONTEXTUAL_BANDIT).costs for e in examples[1:]]
        labelled = [j for j, costs in enumerate(labels) if costs]
        assert labelled == [column]
        cost = labels[column][0]
        assert cost.action == column + 1
        assert math.isclose(cost.cost, -log.slo_met[i], abs_tol=1e-6)
        assert math.isclose(cost.probability, log.production_propensity[i], rel_tol=1e-6)
        workspace.finish_example(examples)
    workspace.finish()
    driver = vowpalwabbit.Workspace(f"--cb_adf --dsjson -d {out / 'slice.dsjson'} --quiet")
    assert driver.get_weighted_examples() == len(lines)
    driver.finish()


def test_export_and_ope_from_the_command_line(live_log: LiveLog, tmp_path: Path) -> None:
    out = tmp_path / "slice"
    args = ["--out", str(out), "--workload-kind", "train", "--scenario", "train"]
    result = cli(export_app, [*args, "--batch-rows", "500"], live_log.url)
    assert result.exit_code == 0, result.output
    assert "rows/s" in result.output and "lcb-planner" in result.output
    live, streamed = tmp_path / "live.json", tmp_path / "parquet.json"
    result = cli(
        evaluation_app, ["ope", "--workload-kind", "train", "--json", str(live)], live_log.url
    )
    assert result.exit_code == 0, result.output
    result = cli(evaluation_app, ["ope", "--parquet", str(out), "--json", str(streamed)], "")
    assert result.exit_code == 0, result.output
    assert_same(json.loads(live.read_text()), json.loads(streamed.read_text()))


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--since", "yesterday"], "--since"),
        (["--since", "2026-11-30", "--until", "2026-11-29"], "--until"),
        (["--workload-kind", "training"], "--workload-kind"),
        (["--policy", "no-such-policy"], "--policy"),
        (["--format", "csv"], "--format"),
        (["--batch-rows", "0"], "--batch-rows"),
    ],
)
def test_a_bad_filter_exits_2_naming_the_option(
    live_log: LiveLog, tmp_path: Path, args: list[str], option: str
) -> None:
    result = cli(export_app, ["--out", str(tmp_path / "x"), *args], live_log.url)
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert not (tmp_path / "x").exists()


def test_a_bad_slice_or_output_folder_exits_2_naming_the_option(
    live_log: LiveLog, tmp_path: Path
) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    result = cli(export_app, ["--out", str(tmp_path / "full")], live_log.url)
    assert result.exit_code == 2 and "--out" in result.output
    for folder in (tmp_path / "missing", tmp_path / "full"):
        result = cli(evaluation_app, ["ope", "--parquet", str(folder)], live_log.url)
        assert result.exit_code == 2, result.output
        assert "--parquet" in result.output


def test_an_empty_slice_exports_and_reads_as_no_rounds(live_log: LiveLog, tmp_path: Path) -> None:
    out = tmp_path / "empty"
    result = cli(export_app, ["--out", str(out), "--since", "2100-01-01"], live_log.url)
    assert result.exit_code == 0, result.output
    assert not list(out.rglob("*.parquet"))
    result = cli(
        evaluation_app, ["ope", "--parquet", str(out), "--json", str(tmp_path / "o.json")], ""
    )
    assert result.exit_code == 0, result.output
    assert "no joined rounds" in result.output
    assert json.loads((tmp_path / "o.json").read_text())["rounds"] == 0


def test_an_unreachable_database_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    """Through `understudy` itself, whose boundary (service.cli.errors) words user errors."""
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    result = cli(understudy, ["export", "--out", str(tmp_path / "x")], url)
    assert result.exit_code == 3, result.output  # cli_errors: 3 = database unreachable
    assert isinstance(result.exception, SystemExit), result.exception  # typer.Exit, not a crash
    assert "database unavailable" in result.output and "127.0.0.1:1" in result.output
    assert "Traceback" not in result.output
