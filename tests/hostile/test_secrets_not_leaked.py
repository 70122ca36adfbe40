"""No token or secret in logs, metric labels or error bodies.

A service runs with a known runtime token; authenticated and refused calls
are made on both transports (a wrong token, malformed headers — some carrying
the real token under the wrong scheme), then everything the service said is
searched for the raw token, its sha256 digest (what the settings store) and
the ``Authorization`` header value: the DEBUG log of the whole process, the
process's own stdout/stderr when it is a real ``understudy serve``, every
``/metrics`` sample (names, label values) and every response body.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from service.auth import token_digest
from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2


@dataclass
class Said:
    """Everything the service sent back to the callers."""

    bodies: list[str] = field(default_factory=list)


def _secrets(token: str) -> dict[str, str]:
    return {
        "raw token": token,
        "sha256 digest": token_digest(token),
        "authorization header": f"Bearer {token}",
    }


def _headers_to_try(token: str) -> list[str | None]:
    """The right header, wrong tokens, and the real token under malformed schemes."""
    return [
        f"Bearer {token}",
        None,
        "Bearer wrong-token",
        "Bearer",
        f"Token {token}",
        token,
        f"Bearer {token}x",
        f"Bearer {token[:-1]}",
        f"bearer   {token}   trailing",
        "Basic dXNlcjpwYXNz",
    ]


def _exercise_http(port: int, token: str, request: MirrorRequest, said: Said) -> None:
    base = f"http://127.0.0.1:{port}"
    good = mirror_to_json(request)
    with httpx.Client(base_url=base, timeout=10) as http:
        for header in _headers_to_try(token):
            headers = {} if header is None else {"authorization": header}
            for path, body in (
                ("/v1/mirror", good),
                ("/v1/mirror", b'{"request_id": 1}'),
                ("/v1/outcomes", b"{not json"),
            ):
                said.bodies.append(http.post(path, content=body, headers=headers).text)
            said.bodies.append(http.get("/openapi.json", headers=headers).text[:2000])
            said.bodies.append(http.get("/metrics", headers=headers).text)


def _exercise_grpc(port: int, token: str, request: MirrorRequest, said: Said) -> None:
    message = mirror_request_to_pb(request)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        unary = channel.unary_unary(
            f"/{SERVICE_NAME}/Mirror",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.MirrorAck.FromString,
        )
        stream = channel.stream_stream(
            f"/{SERVICE_NAME}/MirrorStream",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.StreamAck.FromString,
        )
        for header in _headers_to_try(token):
            metadata = () if header is None else (("authorization", header),)
            for body in (message, contract_pb2.MirrorRequest(request_id="x")):
                try:
                    said.bodies.append(str(unary(body, metadata=metadata, timeout=10)))
                except grpc.RpcError as err:
                    said.bodies.append(f"{err.code()} {err.details()}")
            envelopes = [shadow_pb2.MirrorStreamRequest(sequence=1, request=message)]
            try:
                said.bodies.extend(str(a) for a in stream(iter(envelopes), metadata=metadata))
            except grpc.RpcError as err:
                said.bodies.append(f"{err.code()} {err.details()}")


def _metrics_text(port: int, token: str) -> str:
    response = httpx.get(
        f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200
    return response.text


def _assert_absent(where: str, text: str, token: str) -> None:
    for name, secret in _secrets(token).items():
        assert secret not in text, f"the {name} appears in {where}"


def test_no_secret_in_the_log_metrics_or_responses(
    service: Service,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    said = Said()
    _exercise_http(service.http_port, runtime_token, requests_sample[0], said)
    _exercise_grpc(service.grpc_port, runtime_token, requests_sample[0], said)
    metrics = _metrics_text(service.http_port, runtime_token)
    refused = service.metrics.registry.get_sample_value(
        "understudy_auth_failures_total", {"transport": "http", "reason": "Unauthenticated"}
    )
    assert refused and refused >= 8, "the refused calls were not made"
    _assert_absent("the log", caplog.text, runtime_token)
    _assert_absent("/metrics", metrics, runtime_token)
    _assert_absent("the responses", "\n".join(said.bodies), runtime_token)
    labels = {
        value
        for family in service.metrics.registry.collect()
        for sample in family.samples
        for value in sample.labels.values()
    }
    _assert_absent("metric labels", "\n".join(labels), runtime_token)


@pytest.fixture()
def served(
    tmp_path: Path, runtime_token: str
) -> Iterator[tuple[subprocess.Popen[str], dict[str, int]]]:
    """A real `understudy serve` (ingest only) at DEBUG, its output kept in files."""
    env = os.environ | {
        "UNDERSTUDY_AUTH_TOKENS": json.dumps({token_digest(runtime_token): "runtime"}),
        "UNDERSTUDY_SCORING_ENABLED": "false",
        "UNDERSTUDY_DATA_DIR": str(tmp_path / "data"),
        "UNDERSTUDY_GRPC_PORT": "0",
        "UNDERSTUDY_HTTP_PORT": "0",
        "UNDERSTUDY_JOURNAL_FSYNC": "never",
    }
    with open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "serve", "--log-level", "DEBUG"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert process.stdout is not None
        try:
            ports = json.loads(process.stdout.readline())
            yield process, {"grpc": ports["grpc_port"], "http": ports["http_port"]}
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
            process.stdout.close()


@pytest.mark.slow
def test_no_secret_in_the_output_of_understudy_serve(
    served: tuple[subprocess.Popen[str], dict[str, int]],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    tmp_path: Path,
) -> None:
    process, ports = served
    said = Said()
    _exercise_http(ports["http"], runtime_token, requests_sample[0], said)
    _exercise_grpc(ports["grpc"], runtime_token, requests_sample[0], said)
    metrics = _metrics_text(ports["http"], runtime_token)
    process.send_signal(signal.SIGTERM)
    stdout, _ = process.communicate(timeout=20)
    stderr = (tmp_path / "stderr").read_text()
    assert "DEBUG" in stderr, "the process did not log at DEBUG"
    _assert_absent("stdout", stdout, runtime_token)
    _assert_absent("stderr", stderr, runtime_token)
    _assert_absent("/metrics", metrics, runtime_token)
    _assert_absent("the responses", "\n".join(said.bodies), runtime_token)


def test_a_raw_token_in_the_settings_is_refused_without_being_echoed(tmp_path: Path) -> None:
    raw = f"raw-{secrets.token_urlsafe(12)}"
    env = os.environ | {
        "UNDERSTUDY_AUTH_TOKENS": json.dumps({raw: "runtime"}),
        "UNDERSTUDY_SCORING_ENABLED": "false",
        "UNDERSTUDY_DATA_DIR": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "sha256 hex digests" in done.stderr
    assert raw not in done.stdout + done.stderr


def test_the_settings_repr_holds_no_digest(service: Service, runtime_token: str) -> None:
    digest = token_digest(runtime_token)
    assert digest not in repr(service.settings)
    assert digest not in repr(service)
