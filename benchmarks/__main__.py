"""`make bench`: ingest costs as ratios against the raw limits of its own stack.

Machines here are noisy, so every figure is paired with the raw limit measured
in the same run, on the same payloads, and reported as a ratio:

- journal append vs a raw ``os.write`` of the same bytes to an O_APPEND file;
- gRPC ``Mirror`` (parse + validate + journal + ack) vs a bare gRPC server
  whose handler returns a constant ack for the same bytes, same channel.

Loopback only, bounded counts; results go to ``out/bench/ingest.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from service.app import build_service
from service.auth import token_digest
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig
from service.pipeline.journal_format import RecordKind
from service.samples import sample_requests
from service.settings import Settings
from service.wire.convert import mirror_request_to_pb

ROUNDS = 3


def rate(fn: Callable[[], None], n: int) -> float:
    """Median calls per second over ROUNDS rounds of `n` calls."""
    rates = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_journal(payload: bytes, tmp: Path) -> tuple[float, float]:
    fd = os.open(tmp / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    raw = rate(lambda: os.write(fd, payload), 20_000)
    os.close(fd)
    journal = IngestJournal(
        JournalConfig(directory=tmp / "journal", max_bytes=1 << 34, fsync_mode=FsyncMode.NEVER)
    )
    ours = rate(lambda: journal.append(RecordKind.MIRROR, payload), 20_000)
    journal.close()
    return raw, ours


def bench_grpc(payload: bytes, tmp: Path) -> tuple[float, float]:
    ack = b"\x08\x01"
    bare = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: ack)
    bare.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bare.Bare", {"M": handler}),)
    )
    port = bare.add_insecure_port("127.0.0.1:0")
    bare.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/bare.Bare/M")
        raw = rate(lambda: call(payload), 2_000)
    bare.stop(0)

    token = "bench-token"
    service = build_service(
        Settings(
            data_dir=tmp / "svc",
            grpc_port=0,
            http_port=0,
            journal_fsync="never",
            scoring_enabled=False,  # this benchmark measures the ack path alone
            auth_tokens={token_digest(token): "runtime"},
        )
    )
    service.start()
    meta = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.unary_unary("/understudy.v1.ShadowEvaluation/Mirror")
        ours = rate(lambda: call(payload, metadata=meta), 2_000)
    service.stop(0.5)
    return raw, ours


def main() -> None:
    console = Console()
    request = next(iter(sample_requests(1, seed=11)))
    payload = mirror_request_to_pb(request).SerializeToString()
    results = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with console.status("journal append vs raw write"):
            results["journal_append"] = bench_journal(payload, tmp)
        with console.status("gRPC Mirror vs bare gRPC server"):
            results["grpc_mirror_unary"] = bench_grpc(payload, tmp)
    table = Table(
        "benchmark", "raw limit /s", "understudy /s", "ratio", title=f"payload {len(payload)} B"
    )
    out = {}
    for name, (raw, ours) in results.items():
        table.add_row(name, f"{raw:,.0f}", f"{ours:,.0f}", f"{ours / raw:.2f}")
        out[name] = {"raw_per_s": raw, "understudy_per_s": ours, "ratio": ours / raw}
    console.print(table)
    Path("out/bench").mkdir(parents=True, exist_ok=True)
    Path("out/bench/ingest.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
