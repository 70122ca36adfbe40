"""`scorer_mode` auto: a multi-core service scores in a child process, one core in a thread.

Issue 24, build 4: ingest does nothing but receive, validate, journal and ack,
so its acks never wait for a GIL held by scoring. The resolver's tests patch
`os.sched_getaffinity` (the core count is all they vary, and only the
resolver reads it); the end-to-end test builds a real service with the
default settings, unpinned, and finds its scorer child by pid.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from service.auth import token_digest
from service.cli import main as cli
from service.contract import MirrorRequest
from service.pipeline.scorer import Scorer
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server import scorer_wiring
from service.server.app import Service, build_service
from service.server.scorer_wiring import resolve_scorer_mode, usable_cores
from service.settings import Settings
from tests.pipeline.test_scorer_process import BASELINES, handler_of, logged_ids, stream
from tests.transport.test_decision_log_e2e import wait_until


def cores(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Make the resolver see `n` cores, no CPU quota (a test of the resolver only)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    monkeypatch.setattr(scorer_wiring, "CGROUP_CPU_MAX", Path("/nonexistent/cpu.max"))


def readiness_detail(service: Service, name: str) -> str:
    ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=10).json()
    return {c["name"]: c["detail"] for c in ready["checks"]}[name]


class Unsendable:
    """A policy holding a lock: it cannot be pickled to a scorer process."""

    name, version = "unsendable", "test"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inner = LeastLoaded()

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        with self._lock:
            return self._inner.decide(batch, rng)


def unsendable_registry() -> Registry:
    return Registry(policies={"unsendable": Unsendable()}, predictors={})


# --- the resolver (core count patched) ---------------------------------------------------


def test_the_default_is_auto() -> None:
    assert Settings.model_fields["scorer_mode"].default == "auto"


@pytest.mark.parametrize(("n", "mode"), [(1, "thread"), (2, "process"), (16, "process")])
def test_auto_scores_in_a_process_only_with_more_than_one_core(
    monkeypatch: pytest.MonkeyPatch, n: int, mode: str
) -> None:
    cores(monkeypatch, n)
    placement = resolve_scorer_mode("auto")
    assert placement.mode == mode and not placement.fell_back
    assert ("one core" if n == 1 else f"{n} cores") in placement.reason


@pytest.mark.parametrize(
    ("cpu_max", "n"),
    [("100000 100000", 1), ("150000 100000", 1), ("200000 100000", 2), ("max 100000", 8)],
)
def test_a_cgroup_cpu_quota_caps_the_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str, n: int
) -> None:
    cores(monkeypatch, 8)  # a pod's affinity shows every node core; its limit is the quota
    limit = tmp_path / "cpu.max"
    limit.write_text(cpu_max + "\n")
    monkeypatch.setattr(scorer_wiring, "CGROUP_CPU_MAX", limit)
    assert usable_cores() == n
    assert resolve_scorer_mode("auto").mode == ("process" if n > 1 else "thread")
    monkeypatch.setattr(scorer_wiring, "CGROUP_CPU_MAX", tmp_path / "absent")
    assert usable_cores() == 8


def test_without_an_affinity_call_the_machine_count_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(scorer_wiring, "CGROUP_CPU_MAX", Path("/nonexistent/cpu.max"))
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert usable_cores() == 3
    assert resolve_scorer_mode("auto").mode == "process"
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1


@pytest.mark.parametrize("n", [1, 4])
def test_an_explicit_mode_is_kept_whatever_the_cores(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    cores(monkeypatch, n)
    assert resolve_scorer_mode("thread").mode == "thread"
    assert resolve_scorer_mode("process").mode == "process"


def test_auto_falls_back_to_the_thread_when_the_policies_cannot_be_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores(monkeypatch, 4)
    placement = resolve_scorer_mode("auto", unsendable="it does not pickle")
    assert placement.mode == "thread" and placement.fell_back
    assert "it does not pickle" in placement.reason
    with pytest.raises(ValueError, match="`scorer_mode` process: it does not pickle"):
        resolve_scorer_mode("process", unsendable="it does not pickle")


# --- real services -----------------------------------------------------------------------


def test_a_service_given_unpicklable_policies_falls_back_to_the_thread_with_a_reason(
    make_service: Callable[..., Service],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    cores(monkeypatch, 4)
    with caplog.at_level(logging.INFO, logger="service.server.app"):
        service = make_service(policies=unsendable_registry(), scorer_mode="auto")
    assert isinstance(service.scorer, Scorer), "scoring on the ingest process's thread"
    assert service.scorer_placement.mode == "thread" and service.scorer_placement.fell_back
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("auto fell back from process" in r.getMessage() for r in warned), caplog.text
    assert "pass `policy_factory`" in readiness_detail(service, "scorer_mode")
    ids = stream(service, runtime_token, requests_sample[:10], "fallback")
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    assert sorted(logged_ids(service)) == sorted(ids), "the fallback scores and logs"


def test_an_explicit_process_mode_with_unpicklable_policies_still_fails_clearly(
    make_service: Callable[..., Service],
) -> None:
    with pytest.raises(ValueError, match=r"cannot be sent to the scorer process.*policy_factory"):
        make_service(policies=unsendable_registry(), scorer_mode="process")


def test_an_ingest_only_service_runs_no_scorer_whatever_the_mode(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    cores(monkeypatch, 4)
    service = make_service(scoring_enabled=False, scorer_mode="auto")
    assert service.scorer is None and service.scorer_placement.mode == "thread"
    ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=10).json()
    assert "scorer_mode" not in {c["name"] for c in ready["checks"]}


@pytest.mark.live
@pytest.mark.skipif(usable_cores() < 2, reason="auto picks the process only with two cores")
def test_the_default_settings_score_in_a_child_process_on_a_multi_core_box(
    tmp_path: Path,
    db_url: str,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(  # no scorer_mode: the shipped default, nothing patched
        database_url=db_url,
        data_dir=tmp_path / "data",
        grpc_port=0,
        http_port=0,
        auth_tokens={token_digest(runtime_token): "runtime"},
        journal_fsync="never",
        evaluator_enabled=False,
    )
    assert settings.scorer_mode == "auto"
    with caplog.at_level(logging.INFO, logger="service.server.app"):
        service = build_service(settings, policies=BASELINES)
    assert any("scorer mode: process (auto:" in r.getMessage() for r in caplog.records)
    service.start()
    try:
        service.wait_started()
        handler = handler_of(service)
        pid = handler.child_pid
        assert pid is not None and pid != os.getpid()
        assert Path(f"/proc/{pid}").exists(), "the scorer child is alive"
        assert handler.health()[0] and " ready;" in handler.health()[1]
        assert readiness_detail(service, "scorer_mode").startswith("process (auto:")
        ids = stream(service, runtime_token, requests_sample * 2, "default")
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        assert sorted(logged_ids(service)) == sorted(ids), "scored into the log by the child"
        assert handler.child_pid == pid, "the same child scored them all"
    finally:
        service.stop(grace=0.5)
        if service.engine is not None:
            service.engine.dispose()
    assert not Path(f"/proc/{pid}").exists(), "stop() reaped the child"


# --- `understudy serve` flags ------------------------------------------------------------


@pytest.fixture()
def served(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """What `understudy serve` would run: the settings handed to `service.server.app.serve`."""
    import service.server.app as app

    seen: list[Settings] = []
    monkeypatch.setattr(app, "serve", seen.append)
    monkeypatch.delenv("UNDERSTUDY_SCORER_MODE", raising=False)
    return seen


@pytest.mark.parametrize(
    ("args", "mode"),
    [
        ([], "auto"),
        (["--scorer-mode", "thread"], "thread"),
        (["--scorer-mode", "process"], "process"),
        (["--scorer-mode", "auto"], "auto"),
        (["--scorer-process"], "process"),  # the older spelling
        (["--scorer-process", "--scorer-mode", "process"], "process"),
    ],
)
def test_serve_takes_the_scorer_mode_from_its_flags(
    served: list[Settings], args: list[str], mode: str
) -> None:
    out = CliRunner().invoke(cli.app, ["serve", "--log-level", "WARNING", *args])
    assert out.exit_code == 0, out.output
    assert [s.scorer_mode for s in served] == [mode]


def test_serve_without_the_flag_keeps_the_environment_s_mode(
    served: list[Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNDERSTUDY_SCORER_MODE", "thread")
    out = CliRunner().invoke(cli.app, ["serve"])
    assert out.exit_code == 0, out.output
    assert [s.scorer_mode for s in served] == ["thread"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--scorer-mode", "threads"], "--scorer-mode"),
        (["--scorer-process", "--scorer-mode", "thread"], "--scorer-process"),
    ],
)
def test_serve_refuses_a_bad_scorer_mode_naming_the_flag(
    served: list[Settings], args: list[str], named: str
) -> None:
    out = CliRunner().invoke(cli.app, ["serve", *args])
    assert out.exit_code == 2, out.output
    assert named in out.output and not served


# --- the scorer process's start-up log ---------------------------------------------------


def test_the_scorer_process_drops_the_echo_of_the_parent_s_load_warnings() -> None:
    """The child loads the registry the parent loaded and logged: only its errors show."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    root = logging.getLogger()
    root.addHandler(handler)
    probe = logging.getLogger("service.policies.onnx_policy")
    try:
        with scorer_wiring._echoes_dropped():
            probe.warning("policy p: asked for CUDA, running on CPU")
            probe.error("refused policy q: broken")
        probe.warning("after loading")
    finally:
        root.removeHandler(handler)
    assert seen == ["refused policy q: broken", "after loading"]
