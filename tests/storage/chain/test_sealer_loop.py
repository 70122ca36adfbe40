"""The sealer thread: seals on its own, reports metrics, survives a failing seal."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from service.metrics import ServiceMetrics
from service.storage.chain.anchor import Anchor, SealRefused
from service.storage.chain.seal import ChainSealer
from service.storage.chain.sealer import SealerLoop, SealMetrics
from service.storage.chain.verify import verify


def _value(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_the_loop_seals_and_reports(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    registry = CollectorRegistry()
    loop = SealerLoop(make_sealer(), SealMetrics(ServiceMetrics(registry)), interval_s=0.05)
    loop.start()
    waiter = threading.Event()
    for _ in range(600):  # a deadline for a hung loop, not a speed assertion
        if _value(registry, "understudy_chain_sealed_rows_total") >= 140:
            break
        waiter.wait(0.05)
    loop.stop()
    assert _value(registry, "understudy_chain_sealed_rows_total") == 140
    assert _value(registry, "understudy_chain_seal_lag_seconds") == 0
    assert _value(registry, "understudy_chain_seal_errors_total") == 0


def test_a_failing_seal_is_counted_and_the_loop_goes_on(
    logged: Engine, make_sealer: Callable[..., ChainSealer], tmp_path: Path
) -> None:
    sealer = make_sealer()
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    sealer.anchor.path = blocked / "anchor.jsonl"  # appending fails: ENOTDIR
    registry = CollectorRegistry()
    loop = SealerLoop(sealer, SealMetrics(ServiceMetrics(registry)), interval_s=60)
    loop.tick()
    loop.tick()
    assert _value(registry, "understudy_chain_seal_errors_total") == 2
    assert _value(registry, "understudy_chain_sealed_rows_total") == 0
    sealer.anchor = Anchor(tmp_path / "anchor.jsonl", sealer.anchor.key)
    loop.tick()  # the rows committed by the failed seal are anchored now
    assert _value(registry, "understudy_chain_seal_errors_total") == 2
    assert verify(logged, [sealer.anchor.path], sealer.anchor.key).ok


def test_a_refused_seal_is_counted_apart_and_makes_the_service_unready(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    registry = CollectorRegistry()
    loop = SealerLoop(sealer, SealMetrics(ServiceMetrics(registry)), 60, (SealRefused,))
    loop.tick()
    assert loop.status() == (True, "sealing")
    lines = sealer.anchor.path.read_text()
    sealer.anchor.path.write_text("")  # cut: the witness still holds the line

    loop.tick()
    loop.tick()

    ready, why = loop.status()
    assert not ready and "the anchor file was cut" in why, why
    assert _value(registry, "understudy_chain_seal_refusals_total") == 2
    assert _value(registry, "understudy_chain_seal_errors_total") == 0
    assert sealer.anchor.path.read_text() == ""  # nothing signed
    sealer.anchor.path.write_text(lines)  # restored from a copy: a restarted service seals
    restarted = SealerLoop(make_sealer(), SealMetrics(ServiceMetrics(CollectorRegistry())), 60)
    restarted.tick()
    assert restarted.status() == (True, "sealing")
