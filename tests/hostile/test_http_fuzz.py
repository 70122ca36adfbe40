"""Schemathesis against the live OpenAPI document of a real uvicorn on loopback.

Every operation in ``/openapi.json`` is fuzzed with schema-conforming
(positive) and schema-violating (negative) cases, with the runtime token.
Nothing may answer 5xx, responses must match the document, negative data must
be refused, and every 4xx on an ingest path must be counted: the rise of
``understudy_ingest_total{result="rejected"}`` plus
``understudy_auth_failures_total`` equals the refusals seen, exactly.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode, Response
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
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
    call: Callable[[Case], Response],
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
    headers = {"authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=headers, timeout=10)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {*INGEST_PATHS, "/healthz", "/readyz"}
    # Every POST documents its body (pydantic's `$defs` once left it dangling).
    assert all(len(op.body) for op in operations if op.method.upper() == "POST")
    tally = Tally()
    with requests.Session() as session:

        def call(case: Case) -> Response:
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
    tally = _fuzz_and_reconcile(service, runtime_token, max_examples=6)
    assert tally.refused > 0
    _still_serves(service, runtime_token)


@pytest.mark.slow
def test_schemathesis_every_endpoint_finds_no_5xx_and_counts_every_refusal(
    service: Service, runtime_token: str
) -> None:
    tally = _fuzz_and_reconcile(service, runtime_token, max_examples=75)
    assert tally.examples >= 200
    _still_serves(service, runtime_token)


def test_schemathesis_with_a_wrong_token_is_401_and_counted(
    service: Service, runtime_token: str
) -> None:
    base = f"http://127.0.0.1:{service.http_port}"
    headers = {"authorization": f"Bearer {runtime_token}"}
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=headers, timeout=10)
    before = refusals(service, "http")
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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


def _json_paths(node: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    paths: list[tuple[str | int, ...]] = [prefix] if prefix else []
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node[:3])
        if isinstance(node, list)
        else ()
    )
    for key, child in children:
        paths.extend(_json_paths(child, (*prefix, key)))
    return paths


@st.composite
def json_mutation(draw: st.DrawFn, valid: dict[str, Any]) -> dict[str, Any]:
    """`valid` with one to three values replaced by any JSON, removed, or lists grown."""
    body = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_json_paths(body)))
        parent: Any = body
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["alike", "alike", "replace", "remove", "grow"]))
        old = parent[path[-1]]
        if action == "remove" and isinstance(parent, dict):
            parent.pop(path[-1])
        elif action == "grow" and isinstance(old, list):
            old.extend(draw(st.lists(_alike(old[0]) if old else JSON_VALUES, min_size=1)))
        elif action == "alike":
            parent[path[-1]] = draw(_alike(old))
        else:
            parent[path[-1]] = draw(JSON_VALUES)
    return body


def _alike(value: Any) -> st.SearchStrategy[Any]:
    """Any value of `value`'s JSON type: the kind of change that passes the parser."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers()
    if isinstance(value, float):
        return st.floats()
    if isinstance(value, str):
        return st.text(max_size=20)
    if isinstance(value, list):
        return st.lists(_alike(value[0]) if value else JSON_VALUES, max_size=len(value) + 2)
    return JSON_VALUES


def _fuzz_json_mutations(
    service: Service, token: str, requests_sample: list[MirrorRequest], max_examples: int
) -> Counter[tuple[str, int]]:
    mirrors = [json.loads(mirror_to_json(r)) for r in requests_sample[:5]]
    outcomes = [
        {"request_id": r.request_id, "observed_at": r.request_time + 60, "failure": "none"}
        for r in requests_sample[:5]
    ]
    drawn = st.one_of(
        st.sampled_from(mirrors).flatmap(json_mutation).map(lambda b: ("/v1/mirror", b)),
        st.sampled_from(outcomes).flatmap(json_mutation).map(lambda b: ("/v1/outcomes", b)),
    )
    seen: Counter[tuple[str, int]] = Counter()
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    ) as http:

        @settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(drawn=drawn)
        def run(drawn: tuple[str, dict[str, Any]]) -> None:
            path, body = drawn
            refused, acked = refusals(service, "http"), ingested(service, "http")
            response = http.post(path, content=json.dumps(body))
            seen[(path, response.status_code)] += 1
            # 409: a mutation that kept a known request_id with other content (the identity rule)
            assert response.status_code in (202, 400, 409), (response.text, body)
            if response.status_code != 202:
                message = response.json()["message"]
                assert f"`{response.json()['field']}`" in message, message
            counted = (ingested(service, "http") - acked, refusals(service, "http") - refused)
            assert counted == ((1, 0) if response.status_code == 202 else (0, 1))

        run()
    return seen


def test_mutated_valid_bodies_are_acked_or_refused_naming_the_field_smoke(
    service: Service, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    seen = _fuzz_json_mutations(service, runtime_token, requests_sample, max_examples=40)
    print(f"\nJSON mutations: {dict(sorted(seen.items()))}")


@pytest.mark.slow
def test_mutated_valid_bodies_are_acked_or_refused_naming_the_field(
    service: Service, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    seen = _fuzz_json_mutations(service, runtime_token, requests_sample, max_examples=300)
    print(f"\nJSON mutations: {dict(sorted(seen.items()))}")
    assert seen[("/v1/mirror", 202)] and seen[("/v1/mirror", 400)]


def test_the_api_document_has_no_dangling_references(service: Service, runtime_token: str) -> None:
    """Found by schemathesis: the bodies' `#/$defs/...` refs resolved to nothing."""
    response = requests.get(
        f"http://127.0.0.1:{service.http_port}/openapi.json",
        headers={"authorization": f"Bearer {runtime_token}"},
        timeout=10,
    )
    text = response.text
    assert response.status_code == 200 and "#/$defs/" not in text
    components = response.json().get("components", {}).get("schemas", {})
    for ref in set(re.findall(r'"\$ref":\s*"#/components/schemas/([^"]+)"', text)):
        assert ref in components, ref
