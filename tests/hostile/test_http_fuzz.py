"""Schemathesis against the live OpenAPI document of a real uvicorn on loopback.

Every operation in ``/openapi.json`` is fuzzed with schema-conforming
(positive) and schema-violating (negative) cases, with the runtime token.
Nothing may answer 5xx, responses must match the document, negative data must
be refused, and every 4xx on an ingest path must be counted: the rise of
``understudy_ingest_total{result="rejected"}`` plus
``understudy_auth_failures_total`` equals the refusals seen, exactly.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import Service
from tests.hostile.metrics_read import ingested, refusals

INGEST_PATHS = ("/v1/mirror", "/v1/outcomes")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class Tally:
    """What the fuzzer saw, by operation and status."""

    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    refused: int = 0
    acked: int = 0

    def record(self, case: Case, status: int) -> None:
        self.statuses[(f"{case.method} {case.path}", status)] += 1
        if case.path in INGEST_PATHS:
            if 400 <= status < 500:
                self.refused += 1
            elif status == 202:
                self.acked += 1

    @property
    def examples(self) -> int:
        return sum(self.statuses.values())


def _has_inputs(operation: APIOperation) -> bool:
    parts = (operation.body, operation.query, operation.headers, operation.path_parameters)
    return any(len(part) for part in parts)


def _fuzz_operation(
    operation: APIOperation,
    mode: GenerationMode,
    call: Callable[[Case], requests.Response],
    max_examples: int,
) -> None:
    checks = [*CHECKS, negative_data_rejection] if mode.is_negative else CHECKS

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        response = call(case)
        case.validate_response(response, checks=checks)

    run()


def _fuzz(
    service: Service,
    token: str,
    max_examples: int,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
) -> Tally:
    base = f"http://127.0.0.1:{service.http_port}"
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", timeout=10)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {*INGEST_PATHS, "/healthz", "/readyz"}
    headers = {"authorization": f"Bearer {token}"}
    tally = Tally()
    with requests.Session() as session:

        def call(case: Case) -> requests.Response:
            response = case.call(base_url=base, session=session, headers=headers, timeout=10)
            tally.record(case, response.status_code)
            return response

        for operation in operations:
            for mode in modes:
                if mode.is_negative and not _has_inputs(operation):
                    continue  # nothing to break: GET /healthz takes no input
                _fuzz_operation(operation, mode, call, max_examples)
    return tally


def _fuzz_and_reconcile(service: Service, token: str, max_examples: int) -> Tally:
    before_refused, before_acked = refusals(service, "http"), ingested(service, "http")
    started = time.perf_counter()
    tally = _fuzz(service, token, max_examples)
    elapsed = time.perf_counter() - started
    print(
        f"\nschemathesis: {tally.examples} calls in {elapsed:.1f} s; "
        f"ingest refused {tally.refused}, acked {tally.acked}; "
        + ", ".join(f"{op} {status}: {n}" for (op, status), n in sorted(tally.statuses.items()))
    )
    assert not [s for (_, s), _n in tally.statuses.items() if s >= 500]
    assert refusals(service, "http") - before_refused == tally.refused
    assert ingested(service, "http") - before_acked == tally.acked
    return tally


def _still_serves(service: Service, token: str) -> None:
    base = f"http://127.0.0.1:{service.http_port}"
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    wrong = requests.post(
        f"{base}/v1/mirror", data=b"{}", headers={"authorization": "Bearer nope"}, timeout=5
    )
    assert wrong.status_code == 401


def test_schemathesis_smoke_finds_no_5xx_and_counts_every_refusal(
    service: Service, runtime_token: str
) -> None:
    tally = _fuzz_and_reconcile(service, runtime_token, max_examples=8)
    assert tally.refused > 0
    _still_serves(service, runtime_token)


@pytest.mark.slow
def test_schemathesis_every_endpoint_finds_no_5xx_and_counts_every_refusal(
    service: Service, runtime_token: str
) -> None:
    tally = _fuzz_and_reconcile(service, runtime_token, max_examples=75)
    assert tally.examples >= 200
    _still_serves(service, runtime_token)


def test_schemathesis_with_a_wrong_token_is_401_and_counted(service: Service) -> None:
    before = refusals(service, "http")
    base = f"http://127.0.0.1:{service.http_port}"
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", timeout=10)
    seen = 0
    with requests.Session() as session:
        for path in INGEST_PATHS:
            operation = schema[path]["POST"]

            @settings(
                max_examples=5,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy())
            def run(case: Case) -> None:
                nonlocal seen
                response = case.call(
                    base_url=base,
                    session=session,
                    headers={"authorization": "Bearer not-a-token"},
                    timeout=10,
                )
                assert response.status_code == 401, response.text
                seen += 1

            run()
    assert refusals(service, "http") - before == seen
