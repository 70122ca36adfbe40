"""SIGKILL right after the acks loses nothing: a real `understudy serve` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from sqlalchemy import text

from service.auth import token_digest
from service.contract import MirrorRequest
from service.pipeline.journal import read_all
from service.pipeline.journal_format import RecordKind
from service.storage import make_engine
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc


class ServerProcess:
    """`understudy serve` in a child process; ports read from its first stdout line."""

    def __init__(
        self, data_dir: Path, token: str, database_url: str | None, grpc_port: int = 0
    ) -> None:
        env = dict(os.environ)
        env.pop("UNDERSTUDY_DATABASE_URL", None)
        if database_url is not None:
            env["UNDERSTUDY_DATABASE_URL"] = database_url
        env.update(
            UNDERSTUDY_DATA_DIR=str(data_dir),
            UNDERSTUDY_GRPC_PORT=str(grpc_port),
            UNDERSTUDY_HTTP_PORT="0",
            UNDERSTUDY_JOURNAL_FSYNC="never",
            UNDERSTUDY_AUTH_TOKENS=json.dumps({token_digest(token): "runtime"}),
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "serve", "--log-level", "WARNING"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited with {self.proc.wait(5)} before listening")
        ready = json.loads(line)
        self.grpc_port: int = ready["grpc_port"]
        self.http_port: int = ready["http_port"]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def terminate(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        code = self.proc.wait(15)
        self._close()
        return code

    def _close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture()
def server_factory(tmp_path: Path, runtime_token: str) -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        if server.proc.poll() is None:
            server.kill()


def _mirror_everywhere(
    server: ServerProcess, token: str, requests: list[MirrorRequest], tag: str
) -> list[str]:
    """Mirror over unary, stream and HTTP; return the ids that were acked as accepted."""
    auth = (("authorization", f"Bearer {token}"),)
    acked = []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        for i, request in enumerate(requests):
            msg = mirror_request_to_pb(request)
            msg.request_id = f"{tag}-unary-{i}"
            if stub.Mirror(msg, metadata=auth).status == shadow_pb2.ACK_STATUS_ACCEPTED:
                acked.append(msg.request_id)
        envelopes = []
        for i, request in enumerate(requests):
            msg = mirror_request_to_pb(request)
            msg.request_id = f"{tag}-stream-{i}"
            envelopes.append(shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=msg))
        last = list(stub.MirrorStream(iter(envelopes), metadata=auth))[-1]
        acked += [e.request.request_id for e in envelopes if e.sequence <= last.sequence]
    for i, request in enumerate(requests):
        body = mirror_to_json(request).replace(
            request.request_id.encode(), f"{tag}-http-{i}".encode()
        )
        response = httpx.post(
            f"http://127.0.0.1:{server.http_port}/v1/mirror",
            content=body,
            headers={"authorization": f"Bearer {token}"},
        )
        if response.json().get("status") == "accepted":
            acked.append(f"{tag}-http-{i}")
    return acked


def _journal_ids(journal: Path) -> list[str]:
    return [
        contract_pb2.MirrorRequest.FromString(r.payload).request_id
        for r in read_all(journal)
        if r.kind == RecordKind.MIRROR
    ]


def test_sigkill_after_acks_then_restart_keeps_every_acked_request(
    tmp_path: Path,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    server_factory: list[ServerProcess],
    db_url: str,
) -> None:
    data = tmp_path / "data"
    first = ServerProcess(data, runtime_token, db_url)
    server_factory.append(first)
    acked = _mirror_everywhere(first, runtime_token, requests_sample[:20], "before")
    assert len(acked) == 60
    first.kill()

    assert _journal_ids(data / "journal") == acked

    second = ServerProcess(data, runtime_token, db_url)
    server_factory.append(second)
    more = _mirror_everywhere(second, runtime_token, requests_sample[20:25], "after")
    assert second.terminate() == 0
    records = read_all(data / "journal")
    assert [r.seq for r in records] == list(range(1, len(acked) + len(more) + 1))
    assert _journal_ids(data / "journal") == acked + more

    # The restarted scorer resumed from its checkpoint: the decision log holds
    # every acked request exactly once (replays of the killed batch deduplicated).
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT request_id FROM requests")).scalars().all()
    finally:
        engine.dispose()
    assert sorted(rows) == sorted(acked + more)
