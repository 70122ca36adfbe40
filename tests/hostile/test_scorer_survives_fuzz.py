"""Hostile input that ingest *accepts* must not wedge the scorer or the decision log.

An acked request is scored and logged behind the journal; if one of them made
every write fail (a NUL in a text column, a timestamp PostgreSQL cannot hold),
the scorer would retry the same batch forever and nothing after it would ever
be logged. Here Hypothesis mutates valid requests and outcomes, everything
ingest accepts is sent to a real scoring service (committed policies, the
embedded PostgreSQL), and then a sentinel request must be logged, the journal
must drain, and the scorer must not have failed a single step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from service.contract import MirrorRequest
from service.server.app import Service
from service.storage import count_decisions, count_requests, logged_request
from service.transport.grpc.servicer import SERVICE_NAME
from service.wire.understudy.v1 import shadow_pb2
from tests.hostile.pb_strategies import mutation
from tests.hostile.test_grpc_fuzz import Metadata, fuzz_settings, valid_mirrors, valid_outcomes


def _send(channel: grpc.Channel, method: str, message: Message, metadata: Metadata) -> bool:
    call = channel.unary_unary(
        f"/{SERVICE_NAME}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=shadow_pb2.MirrorAck.FromString,
    )
    try:
        ack = call(message, metadata=metadata, timeout=10)
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
        return False
    return bool(ack.status == shadow_pb2.ACK_STATUS_ACCEPTED)


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition`; `timeout` is a hang guard (the caller asserts and reports)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # poll interval of a condition wait
    return True


def _accepted_hostile_input_is_logged(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
    examples: int,
) -> None:
    caplog.set_level(logging.WARNING, logger="service")
    service = make_service()
    assert service.engine is not None
    metadata = (("authorization", f"Bearer {runtime_token}"),)
    mirrors, outcomes = valid_mirrors(requests), valid_outcomes(requests)
    accepted = {"Mirror": 0, "ReportOutcome": 0}
    template_ids = {m.request_id for m in mirrors}
    drawn = st.one_of(
        st.sampled_from(mirrors).flatmap(mutation).map(lambda m: ("Mirror", m)),
        st.sampled_from(outcomes).flatmap(mutation).map(lambda m: ("ReportOutcome", m)),
    )
    started = time.perf_counter()
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:

        @fuzz_settings(examples)
        @given(drawn=drawn)
        def run(drawn: tuple[str, Message]) -> None:
            method, message = drawn
            if method == "Mirror" and message.request_id in template_ids:
                # A fresh id, or the log would keep the first and skip the rest.
                message.request_id = f"fuzz-{sum(accepted.values())}-{time.monotonic_ns()}"
            accepted[method] += _send(channel, method, message, metadata)

        run()
        sentinel = type(mirrors[0])()
        sentinel.CopyFrom(mirrors[0])
        sentinel.request_id = "sentinel-after-the-fuzz"
        assert _send(channel, "Mirror", sentinel, metadata)
    engine = service.engine
    drained = _wait(lambda: service.journal.depth_records("scorer") == 0, timeout=240)
    failures = [r for r in caplog.records if r.name.startswith("service.pipeline")]
    statuses = {s: count_decisions(engine, status=s) for s in ("ok", "error", "timeout")}
    print(
        f"\nscorer fuzz: {examples} examples in {time.perf_counter() - started:.1f} s; "
        f"accepted {accepted}; logged requests {count_requests(engine)}; decisions {statuses}; "
        f"scorer warnings/errors {len(failures)}; "
        f"other warnings {sorted({r.getMessage()[:100] for r in caplog.records})[:5]}"
    )
    assert drained, f"journal not drained: {failures[:1]}"
    assert not failures, failures[0].getMessage()
    assert logged_request(engine, "sentinel-after-the-fuzz").request_id == (
        "sentinel-after-the-fuzz"
    )


@pytest.mark.slow
def test_accepted_hostile_input_never_wedges_the_scorer(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _accepted_hostile_input_is_logged(
        make_service, runtime_token, requests_sample, caplog, examples=600
    )


def test_accepted_hostile_input_never_wedges_the_scorer_smoke(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _accepted_hostile_input_is_logged(
        make_service, runtime_token, requests_sample, caplog, examples=40
    )
