"""Drive a real test service as Runtime does: events through the real gRPC client.

Shared by the live tests (drift, calibration, outcome drift, evidence, the
evaluator end to end) instead of each keeping its own copy. Not a conftest:
imported explicitly.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

from service.client import MirrorClient
from service.contract import MirrorRequest, Outcome
from service.policies.manifest import Manifest
from service.server.app import Service
from service.wire.convert import mirror_request_to_pb, outcome_to_pb


def send_events(
    service: Service,
    token: str,
    events: Sequence[MirrorRequest | Outcome],
    *,
    batching: bool = True,
) -> None:
    """Mirror every request and report every outcome, in order; every one acked.

    `batching` False sends them one message each (single-request streams), so each
    request is its own journal record: what a test needs that compares per-request
    arrival order with the log's ``journal_seq`` order (rows of one batch record share
    their seq; docs/drift.md, "Limits")."""
    with MirrorClient(f"127.0.0.1:{service.grpc_port}", token, batching=batching) as client:
        for event in events:
            if isinstance(event, MirrorRequest):
                assert client.mirror(mirror_request_to_pb(event))
            else:
                assert client.report_outcome(outcome_to_pb(event))
        assert client.flush(60)


def wait_for(
    condition: Callable[[], bool], what: str | Callable[[], str], timeout_s: float = 120.0
) -> None:
    """Poll `condition` until true: the test waits on the condition itself, not on a time.

    `timeout_s` is only a hang guard, far above what a loaded machine needs;
    when it trips, the failure says `what` (called then, when it is a function,
    so it can report what it saw).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"still waiting after {timeout_s:.0f} s (hang guard): "
                + (what() if callable(what) else what)
            )
        time.sleep(0.1)  # the poll interval of a condition wait, not a synchronisation


def wait_drained(service: Service, timeout_s: float = 120.0) -> None:
    """Until the scorer has consumed everything journaled."""
    wait_for(
        lambda: service.journal.depth_records("scorer") == 0,
        "the scorer did not drain the journal",
        timeout_s,
    )


GENEROUS_BUDGET_MS = 60_000.0
"""A time budget no loaded test machine reaches (see `generous`)."""


def generous(manifests: Mapping[str, Manifest]) -> dict[str, Manifest]:
    """`manifests` with a 60 s time budget each.

    For live tests whose subject is not the time budget: on a loaded machine
    a policy over its real budget (20 ms per reference batch) is timed out
    and, after a few strikes, quarantined, which would change what the test
    measures. tests/reliability/test_quarantine.py covers budgets.
    """
    return {
        name: dataclasses.replace(m, time_budget_ms=GENEROUS_BUDGET_MS)
        for name, m in manifests.items()
    }
