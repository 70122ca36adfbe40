"""The live drift monitor on a real service, and the report section on the log it left.

A simulated Runtime (the demo's, training condition, seed 0) mirrors through
the real client; the committed ONNX policies score. The drift series must
exist before any traffic; once the journal is drained, every policy with a
training summary has closed ``requests // window`` windows, and the last
window's PSI gauge equals what the evidence section recomputes offline from
the stored raw requests in journal order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from service.cli.demo import simulated_runtime
from service.contract import DEFAULT_FEATURES, HardwareClass, MirrorRequest
from service.environment import simulated_episodes
from service.evaluator.drift_monitor import DriftMonitor
from service.learning.build_models.scorer_fit import synthetic_batch
from service.metrics import ServiceMetrics
from service.pipeline.scoring import score_requests
from service.policies.registry import load_registry
from service.policies.synthetic import random_requests
from service.policies.training_summary import TrainingInputs, featurise, summarise
from service.reports.ope.drift_section import build_drift_section
from service.server.app import Service
from service.storage.reads.ope import OpeFilter
from tests.live_traffic import send_events, wait_for

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
WINDOW = 250
TRAINED = ("gavel-scorer", "iwr-scorer", "lcb-planner")


def test_live_drift_windows_match_the_offline_section(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    service = make_service(drift_window_requests=WINDOW)
    assert service.policies is not None and service.engine is not None
    assert set(service.policies.training_summaries) == set(TRAINED)
    reg = service.metrics.registry

    def sample(metric: str, **labels: str) -> float | None:
        return reg.get_sample_value(metric, labels)

    for p in TRAINED:  # every series exists before the first window closes
        assert sample("understudy_drift_psi_max", policy=p) == 0.0
        assert sample("understudy_drift_flagged", policy=p) == 0.0
        assert sample("understudy_drift_windows_total", policy=p, flagged="true") == 0.0
        assert sample("understudy_drift_windows_total", policy=p, flagged="false") == 0.0
        assert sample("understudy_drift_out_of_support_decisions_total", policy=p) == 0.0
        # trained on simulated episodes: every one has an arrival process
        assert sample("understudy_drift_arrival_shift", policy=p) == 0.0
    for field in ("kind", "qos_class", "hardware", "model_family"):  # counted from 0
        assert sample("understudy_unseen_vocabulary_total", field=field) == 0.0
    for baseline in ("first-fit", "least-loaded"):  # no training data, no series
        assert sample("understudy_drift_flagged", policy=baseline) is None

    events = simulated_runtime(episodes=3, seed=0)
    n_requests = sum(isinstance(e, MirrorRequest) for e in events)
    assert n_requests >= 2 * WINDOW
    # One record per request: the offline section orders by journal_seq, and the rows of
    # one batch record share it (docs/drift.md, "Limits"), so batches could move a window
    # boundary between the two readings.
    send_events(service, runtime_token, events, batching=False)
    wait_for(lambda: service.journal.depth_records("scorer") == 0, "the scorer did not drain")

    def windows(p: str) -> float:
        return sum(
            sample("understudy_drift_windows_total", policy=p, flagged=f) or 0.0
            for f in ("true", "false")
        )

    wait_for(
        lambda: all(windows(p) == n_requests // WINDOW for p in TRAINED),
        "not every window closed",
    )

    section = build_drift_section(service.engine, OpeFilter(), POLICIES_DIR)
    assert section is not None and section.key == "drift"
    by_policy = {r["policy"]: r for r in section.results["policies"]}
    assert set(by_policy) == set(TRAINED)
    for p in TRAINED:
        r = by_policy[p]
        assert r["requests"] == n_requests and r["window_requests"] == WINDOW
        assert len(r["windows"]) == n_requests // WINDOW
        last = r["windows"][-1]
        assert sample("understudy_drift_psi_max", policy=p) == pytest.approx(last["psi_max"])
        assert sample("understudy_drift_flagged", policy=p) == (1.0 if last["flagged"] else 0.0)
        assert r["arrival_threshold"] is not None and last["arrival_shift"] is not None
        shift = sample("understudy_drift_arrival_shift", policy=p)
        assert shift == pytest.approx(last["arrival_shift"])
        flagged = sum(w["flagged"] for w in r["windows"])
        assert sample("understudy_drift_windows_total", policy=p, flagged="true") == flagged
        in_windows = sum(w["out_of_support_decisions"] for w in r["windows"])
        live = sample("understudy_drift_out_of_support_decisions_total", policy=p)
        assert live == r["out_of_support_decisions"] >= in_windows
        assert not r["unseen_hardware"] and not r["unseen_kinds"]  # training condition
    assert all(png.startswith(b"\x89PNG") for png in section.figures.values())
    assert all(f"figures/{name}" in section.html for name in section.figures)
    assert "<td>" in section.html and section.markdown.count("|") > 20


def test_monitor_flags_inputs_new_to_one_policy_and_not_to_another() -> None:
    """Each policy is judged against its own reference. Here `gavel-scorer`'s is
    replaced by one computed from synthetic requests (random K80/P100/V100 clusters;
    the shipped policies are all fitted on simulated episodes): synthetic traffic of
    another seed is in its support, but holds P100 nodes the other two never saw."""
    registry = load_registry(POLICIES_DIR)
    metrics = ServiceMetrics(CollectorRegistry())
    summaries = dict(registry.training_summaries)
    assert set(summaries) == set(TRAINED)
    synthetic = list(synthetic_batch(0, 600).requests)
    x, offsets, starts, cats = featurise([synthetic[i : i + 8] for i in range(0, 600, 8)])
    inputs = TrainingInputs("synthetic", x, offsets, starts, cats, {})
    summaries["gavel-scorer"] = summarise("gavel-scorer", inputs, window_sizes=(WINDOW,))
    monitor = DriftMonitor(summaries, WINDOW, metrics)
    assert set(monitor.policies) == set(TRAINED)
    requests = random_requests(seed=7, n_requests=2 * WINDOW + 10)
    policies = list(registry.policies.values())
    for start in range(0, len(requests), 64):
        batch, decisions, _ = score_requests(
            requests[start : start + 64], policies, DEFAULT_FEATURES
        )
        monitor.observe(batch, decisions)

    def sample(metric: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(metric, labels)

    assert sample("understudy_drift_windows_total", policy="gavel-scorer", flagged="false") == 2
    assert sample("understudy_drift_flagged", policy="gavel-scorer") == 0.0
    for p in ("iwr-scorer", "lcb-planner"):
        assert sample("understudy_drift_windows_total", policy=p, flagged="true") == 2
        assert monitor.last[p].unseen_hardware == ("P100",)
        oos = sample("understudy_drift_out_of_support_decisions_total", policy=p)
        assert oos is not None and oos > 0
    assert (
        sample("understudy_drift_psi_max", policy="iwr-scorer")
        == monitor.last["iwr-scorer"].psi_max
    )


def _open_vocabulary(requests: list[MirrorRequest]) -> list[MirrorRequest]:
    """Every request with an unknown kind and QoS class; every third also on a class
    whose capability numbers are all unknown (None)."""
    out = []
    for i, r in enumerate(requests):
        workload = dataclasses.replace(r.workload, kind="notebook", qos_class="gold")
        state = r.state
        if i % 3 == 0:
            mystery = HardwareClass("mystery-gpu", None, None, None, None)
            state = dataclasses.replace(state, hardware=(mystery, *state.hardware[1:]))
        out.append(dataclasses.replace(r, workload=workload, state=state))
    return out


def test_unknown_kinds_qos_and_capabilities_score_and_are_flagged_and_counted() -> None:
    """Open vocabularies (issue 22): no shipped policy crashes on an unknown kind, QoS class
    or unknown capability numbers; every policy's window flags them; each is counted."""
    registry = load_registry(POLICIES_DIR)
    assert not registry.refused
    metrics = ServiceMetrics(CollectorRegistry())
    monitor = DriftMonitor(registry.training_summaries, WINDOW, metrics)
    requests = _open_vocabulary(random_requests(seed=11, n_requests=WINDOW))
    policies = list(registry.policies.values())
    for start in range(0, len(requests), 50):
        batch, decisions, _ = score_requests(
            requests[start : start + 50], policies, DEFAULT_FEATURES
        )
        assert np.isfinite(batch.features).all()
        failed = [d for d in decisions if d.status not in ("ok", "all_infeasible")]
        assert not failed, failed[:3]
        ok = [d for d in decisions if d.status == "ok"]
        assert ok and all(np.isfinite(d.probabilities).all() for d in ok)
        assert {d.policy for d in decisions} == set(registry.policies)
        monitor.observe(batch, decisions)

    def sample(metric: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(metric, labels)

    for p in TRAINED:
        assert sample("understudy_drift_windows_total", policy=p, flagged="true") == 1
        assert monitor.last[p].unseen_kinds == ("notebook",)
        assert monitor.last[p].unseen_qos == ("gold",)
        assert "mystery-gpu" in monitor.last[p].unseen_hardware
    assert sample("understudy_unseen_vocabulary_total", field="kind") == WINDOW
    assert sample("understudy_unseen_vocabulary_total", field="qos_class") == WINDOW
    hardware = sample("understudy_unseen_vocabulary_total", field="hardware")
    assert hardware is not None and 0 < hardware <= WINDOW
    # the synthetic requests' families are Gavel's, which every manifest lists
    assert sample("understudy_unseen_vocabulary_total", field="model_family") == 0


def test_a_stream_of_unseen_model_families_is_flagged_named_and_counted() -> None:
    """Issue 23: the manifests' ``training_data.model_families`` are read by drift.

    Before, nothing read them: a window of requests of families no policy was
    trained on (known kind, QoS and hardware, features in range) went unflagged.
    """
    registry = load_registry(POLICIES_DIR)
    for p in TRAINED:
        families = registry.manifests[p].training_data.model_families
        assert registry.training_summaries[p].reference.model_families == set(families)
    metrics = ServiceMetrics(CollectorRegistry())
    monitor = DriftMonitor(registry.training_summaries, WINDOW, metrics)
    # the simulator's training scenario: hardware, kinds and QoS every policy saw
    stream = [r for group, _ in simulated_episodes("train", 1, range(12)) for r in group]
    assert len(stream) >= 2 * WINDOW
    known, renamed = stream[:WINDOW], stream[WINDOW : 2 * WINDOW]
    policies = list(registry.policies.values())
    for start in range(0, len(known), 50):  # Gavel's families: not flagged as novel
        batch, decisions, _ = score_requests(known[start : start + 50], policies, DEFAULT_FEATURES)
        monitor.observe(batch, decisions)
    for p in TRAINED:
        assert monitor.last[p].unseen_families == ()
    new = ("Llama-3-8B", "Mixtral-8x7B (batch size 4)")
    unseen = [
        dataclasses.replace(r, workload=dataclasses.replace(r.workload, model_family=new[i % 2]))
        for i, r in enumerate(renamed)
    ]
    for start in range(0, len(unseen), 50):
        batch, decisions, _ = score_requests(unseen[start : start + 50], policies, DEFAULT_FEATURES)
        monitor.observe(batch, decisions)

    def sample(metric: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(metric, labels)

    for p in TRAINED:
        w = monitor.last[p]
        assert w.flagged and w.unseen_families == ("Llama-3-8B", "Mixtral-8x7B")
        assert (w.unseen_kinds, w.unseen_qos, w.unseen_hardware) == ((), (), ())
        assert w.out_of_support_decisions == w.decisions > 0
    assert sample("understudy_unseen_vocabulary_total", field="model_family") == WINDOW
