"""Schemathesis on the reviewer endpoints of the live OpenAPI document, as the reviewer.

Schema-conforming cases for every ``/v1/reviewer`` operation: nothing may
answer 5xx, and status codes, content types and bodies must match what the
document declares. Every call, answered or refused, is in the access log.
"""

from __future__ import annotations

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import text

from tests.storage.reviewer.conftest import TOKENS, World

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _fuzz(operation: APIOperation, mode: GenerationMode, call: object, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        response = call(case)  # type: ignore[operator]
        case.validate_response(response, checks=CHECKS)

    run()


def test_reviewer_endpoints_conform_and_never_fail(world: World) -> None:
    headers = {"authorization": f"Bearer {TOKENS['reviewer']}"}
    schema = schemathesis.openapi.from_url(f"{world.base}/openapi.json", headers=headers)
    operations = [
        result.ok()
        for result in schema.get_all_operations()
        if result.ok().path.startswith("/v1/reviewer/")
    ]
    assert len(operations) == 5  # decisions, request, its feasibility, experiments, events
    with world.engine.connect() as conn:
        start = conn.execute(text("SELECT coalesce(max(access_id), 0) FROM reviewer_access_log"))
        first = int(start.scalar_one())
    statuses: list[int] = []
    with requests.Session() as session:

        def call(case: Case) -> object:
            response = case.call(base_url=world.base, session=session, headers=headers, timeout=30)
            statuses.append(response.status_code)
            return response

        # Every parameter is a free string, which a query string cannot violate: positive
        # cases only (hostile strings are tests/storage/reviewer/test_injection.py's job).
        for operation in operations:
            _fuzz(operation, GenerationMode.POSITIVE, call, 20)
    assert statuses and max(statuses) < 500
    with world.engine.connect() as conn:
        logged = conn.execute(
            text("SELECT count(*) FROM reviewer_access_log WHERE access_id > :a"), {"a": first}
        ).scalar_one()
    assert logged == len(statuses)
