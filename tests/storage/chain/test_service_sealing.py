"""The running service seals what it logs; ``understudy log verify`` accepts it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from service.contract import MirrorRequest
from service.policies.baselines import FirstFit, LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import count_decisions
from service.transport.http.convert import mirror_to_json
from tests.storage.chain.chain_helpers import run_log


def test_a_running_service_seals_its_decisions(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    db_url: str,
    tmp_path: Path,
) -> None:
    chain_dir = tmp_path / "chain"
    service = make_service(
        policies=Registry(
            policies={"first-fit": FirstFit(), "least-loaded": LeastLoaded()}, predictors={}
        ),
        evaluator_enabled=False,
        chain_seal_interval_s=0.1,
        chain_key_file=chain_dir / "chain.key",
        chain_anchor_file=chain_dir / "chain-anchor.jsonl",
    )
    assert service.engine is not None and service.sealer is not None
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {runtime_token}"},
    ) as http:
        for r in requests_sample[:10]:
            assert http.post("/v1/mirror", content=mirror_to_json(r)).json()["status"] == (
                "accepted"
            )
    sealed = service.metrics.registry.get_sample_value
    waiter = threading.Event()
    for _ in range(600):  # a deadline for a hung service, not a speed assertion
        if (sealed("understudy_chain_sealed_rows_total") or 0) >= 20:
            break
        waiter.wait(0.05)
    assert sealed("understudy_chain_sealed_rows_total") == count_decisions(service.engine) == 20
    assert (chain_dir / "chain.key").stat().st_mode & 0o777 == 0o600

    code, out = run_log(db_url, chain_dir, "verify")
    assert code == 0, out
    assert "20 decisions" in out and "0 decisions not sealed yet" in out
