"""Batched ingest: the batch transports at batch sizes 1, 8, 64, 256 vs a bare server.

Points (transport, shape, batch size), issue 24's "Build 5. Bench":

- ``mstream`` (gRPC ``MirrorManyStream``), ``many`` (unary ``MirrorMany``) and
  ``hbatch`` (HTTP ``POST /v1/mirror/batch``, ``application/x-protobuf``) at
  1, 8, 64 and 256 requests per batch, in the shape of record (a 128-node
  snapshot per 8 requests, up to 50 options per request: a 64-request batch
  carries 8 snapshots; `benchmarks.batch_workload`);
- the worst case, every request with its own snapshot, on the batch stream at 64;
- the unbatched single-request stream (``MirrorStream``, `benchmarks.loadgen`'s path).

Understudy is an ingest-only deployment (`benchmarks.batch_target`: receive,
validate, journal, ack; scoring off, so no scorer CPU is in its figures), a
fresh process and journal per point, pinned to *one* core. Its bare server (a
gRPC or HTTP server that parses the same messages and acks them, sync or aio,
whichever is faster here) runs on the same core, and the two are measured
interleaved, run by run, from the same generator process on the other cores.

Per point:

1. the ingest ceiling: closed loop, requests acked (accepted, so journaled)
   per second, beside the bare server's on the same messages;
2. ingest CPU per request: the server process's CPU time over the closed runs
   / the requests it accepted in them (the bare server's likewise);
3. ack p50/p99 at 80% of the ceiling, open loop (scheduled send times; per
   message: a batch's requests share one ack), beside the bare server at the
   same message rate;
4. journal append p50/p99, timed in the service process around every append
   (a batch is one append), beside an ``os.write`` of the same message bytes
   to an ``O_APPEND`` file.

Targets (issue 24) are on the shape-of-record rows at 64 requests per batch
and on the single stream. ``UNDERSTUDY_BENCH_BATCH_TRANSPORTS`` (comma list of
mstream, many, hbatch, worst, stream) and ``UNDERSTUDY_BENCH_BATCH_SIZES``
(comma list) choose a subset.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import batch_workload, workload
from benchmarks.e2e import histogram_quantiles
from benchmarks.harness import BenchResult, Row, Target
from benchmarks.procs import Child, cpu_seconds, cpu_split
from benchmarks.target import ADMIN_TOKEN, TOKEN

SIZES = (1, 8, 64, 256)
BATCHED = ("mstream", "many", "hbatch")
NAMES = {
    "mstream": "gRPC batch stream",
    "many": "gRPC MirrorMany",
    "hbatch": "HTTP batch (protobuf)",
    "stream": "gRPC single-request stream",
}
PROTOCOL = {"mstream": "grpc", "many": "grpc", "hbatch": "http", "stream": "grpc"}
RECORD_BATCH = 64
TODAY_SINGLE = 1632.0  # the single stream's ingest ceiling per core before issue 24


class Plan:
    """Durations and repeats; quick mode is a smoke run (a few seconds per point)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.closed_s = 1.0 if quick else 3.0
        self.open_s = 1.0 if quick else 5.0
        self.warm_s = 0.5 if quick else 1.0
        self.runs = 1 if quick else 3


def server_cpus() -> set[int]:
    """One core for the server side (the targets are per core)."""
    return {min(cpu_split()[0])}


class Generator:
    """The batch load generator process."""

    def __init__(self) -> None:
        self.child = Child("benchmarks.batch_loadgen", [], cpu_split()[1])
        self.child.line(180)
        self.runs = 0

    def run(
        self, point: dict[str, Any], port: int, mode: str, duration: float, rate: float = 0.0
    ) -> dict[str, Any]:
        self.runs += 1
        command = {
            **point,
            "port": port,
            "token": TOKEN,
            "mode": mode,
            "duration": duration,
            "rate": rate,
            "tag": f"g{self.runs}x{int(time.time()) % 100000}",
            "window": _window(point, mode),
        }
        result: dict[str, Any] = self.child.ask(command, timeout=duration + 90)
        if "error" in result:
            raise RuntimeError(f"batch load generator: {result['error']}")
        return result

    def stop(self) -> None:
        self.child.stop()


def _window(point: dict[str, Any], mode: str) -> int:
    """Messages in flight (closed loop) or connections (HTTP open loop)."""
    t, size = str(point["transport"]), int(point["bytes"])
    if t == "stream":
        return 1024
    if t == "mstream":
        return max(4, min(512, (8 << 20) // size))
    if t == "hbatch" and mode == "open":
        return 64
    return 16


class Server:
    """A `benchmarks.batch_target` process and its ports."""

    def __init__(self, kind: str, protocol: str, data_dir: Path | None = None) -> None:
        args = [kind, "--transport", protocol]
        self.data_dir, self.stats = data_dir, None
        if data_dir is not None:
            self.stats = data_dir / "bench-stats.json"
            args += ["--data-dir", str(data_dir), "--stats", str(self.stats)]
        self.kind = kind
        self.child = Child("benchmarks.batch_target", args, server_cpus())
        self.info = self.child.line(300)
        self.pid = self.child.pid
        self.protocol = protocol

    def port(self, transport: str) -> int:
        return int(self.info["http_port" if PROTOCOL[transport] == "http" else "grpc_port"])

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def ingest_totals(self) -> dict[str, float]:
        """understudy_ingest_total of mirrored requests by result (Understudy only)."""
        text = httpx.get(
            f"http://127.0.0.1:{self.info['http_port']}/metrics",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=10,
        ).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "understudy_ingest_total" and s.labels.get("kind") == "mirror":
                    key = s.labels.get("result", "")
                    out[key] = out.get(key, 0.0) + s.value
        return out

    def stop(self) -> dict[str, Any]:
        self.child.stop(60)
        if self.stats is not None and self.stats.exists():
            return dict(json.loads(self.stats.read_text()))
        return {}


def _closed(gen: Generator, server: Server, point: dict[str, Any], plan: Plan) -> dict[str, Any]:
    c0 = server.cpu()
    res = gen.run(point, server.port(point["transport"]), "closed", plan.closed_s)
    res["server_cpu_s"] = server.cpu() - c0
    res["cpu_per_request_us"] = res["server_cpu_s"] / max(res["accepted"], 1) * 1e6
    return res


def _bare_kind(gen: Generator, protocol: str, point: dict[str, Any], plan: Plan) -> Server:
    """Start both bare servers, keep the faster on `point` (one short closed run each)."""
    rates = {}
    for kind in ("bare-sync", "bare-aio"):
        server = Server(kind, protocol)
        try:
            gen.run(point, server.port(point["transport"]), "closed", plan.warm_s)
            rates[kind] = _closed(gen, server, point, plan)["ack_rate"]
        finally:
            server.stop()
    best = max(rates, key=lambda k: rates[k])
    return Server(best, protocol)


def raw_append_us(body: bytes, n: int) -> list[float]:
    """p50/p99 (us) of ``os.write`` of `body` to an O_APPEND file."""
    with tempfile.TemporaryDirectory(prefix="us-bench-") as tmp:
        fd = os.open(Path(tmp) / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, body)
            lat.append(time.perf_counter() - t)
        os.close(fd)
    lat.sort()
    return [lat[int(q * (n - 1))] * 1e6 for q in (0.5, 0.99)]


def measure(gen: Generator, bare: Server, point: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """Every figure of one point, interleaved with the bare server run by run."""
    home = Path(tempfile.mkdtemp(prefix="us-bench-batch-"))
    ours = Server("understudy", PROTOCOL[point["transport"]], home)
    try:
        warm = [
            gen.run(point, s.port(point["transport"]), "closed", plan.warm_s) for s in (bare, ours)
        ]
        bare_closed, ours_closed = [], []
        for _ in range(plan.runs):
            bare_closed.append(_closed(gen, bare, point, plan))
            ours_closed.append(_closed(gen, ours, point, plan))
        ceiling = statistics.median(r["ack_rate"] for r in ours_closed)
        rate = 0.8 * ceiling / point["batch"]  # messages per second
        ours_open = gen.run(point, ours.port(point["transport"]), "open", plan.open_s, rate)
        bare_open = gen.run(point, bare.port(point["transport"]), "open", plan.open_s, rate)
        totals = ours.ingest_totals()
    finally:
        stats = ours.stop()
        shutil.rmtree(home, ignore_errors=True)
    append = stats.get("journal_append")
    qs = (0.5, 0.99, 0.999, 1.0)
    q = histogram_quantiles(append["counts"], qs) if append else [float("nan")] * len(qs)
    return {
        **point,
        "bare_kind": bare.kind,
        "bare_closed": bare_closed,
        "closed": ours_closed,
        "ceiling": ceiling,
        "latency_rate_messages": rate,
        "latency": ours_open,
        "bare_latency": bare_open,
        "warm_up": warm[1],
        "ingest_totals": totals,
        "journal_append_us": [v * 1e6 for v in q[:2]],
        "journal_append_p999_max_us": [v * 1e6 for v in q[2:]],
        "journal_appends": sum(append["counts"]) if append else 0,
        "gc_pauses": stats.get("gc_pauses"),
    }


def _label(m: dict[str, Any]) -> str:
    if m["transport"] == "stream":
        return NAMES["stream"]
    shape = "" if m["shape"] == "record" else ", every request its own snapshot"
    return f"{NAMES[m['transport']]} x{m['batch']} ({m['snapshots']} snapshots{shape})"


def _rows(m: dict[str, Any]) -> list[Row]:
    label = _label(m)
    of_record = m["shape"] == "record" and m["batch"] == RECORD_BATCH and m["transport"] != "stream"
    bare_name = f"{m['bare_kind']} server, parse + ack"
    ours = [r["ack_rate"] for r in m["closed"]]
    raw = [r["ack_rate"] for r in m["bare_closed"]]
    faults = sum(r["shed"] + r["rejected"] + r["errors"] for r in m["closed"])
    gen_cores = max(r["generator_cores"] for r in m["bare_closed"])
    note = (
        f"{m['bytes']:,} B per message; generator used {gen_cores:.2f} of its core on the bare "
        "server"
        + ("; the bare figure may be a lower bound" if gen_cores > 0.8 else "")
        + (f"; {faults} shed/rejected/errors in the closed runs" if faults else "")
    )
    rows = [
        Row.paired(
            f"{label}: ingest ceiling (closed loop, requests acked and journaled/s)",
            "req/s",
            ours,
            raw,
            bare_name,
            Target(">= 50% of the bare server's rate on the same messages", 0.5)
            if of_record
            else None,
            note=note,
        )
    ]
    if of_record or m["transport"] == "stream":
        target = (
            Target(">= 50,000 requests/s per core (floor 20,000)", 50_000.0, on="figure")
            if of_record
            else Target(
                f">= 2x today's {TODAY_SINGLE:,.0f} req/s per core (>= 3,300)", 3300.0, on="figure"
            )
        )
        rows.append(
            Row.paired(
                f"{label}: ingest ceiling vs the target",
                "req/s",
                [statistics.median(ours)],
                [target.threshold],
                "the issue's target",
                target,
            )
        )
    rows.append(
        Row.paired(
            f"{label}: ingest CPU per request (at the ceiling)",
            "us",
            [r["cpu_per_request_us"] for r in m["closed"]],
            [r["cpu_per_request_us"] for r in m["bare_closed"]],
            bare_name,
            higher_is_better=False,
            note="ingest-only process (scoring off: no scorer CPU counted); CPU time / accepted",
        )
    )
    for q in ("p50", "p99"):
        tgt = None
        if q == "p99" and of_record:
            tgt = Target("ack p99 at 80% <= 1.5x the bare server's", 1.5, at_least=False)
        rows.append(
            Row.paired(
                f"{label}: ack {q} at 80% of the ceiling (per message)",
                "ms",
                [m["latency"].get(f"{q}_ms", float("nan"))],
                [m["bare_latency"].get(f"{q}_ms", float("nan"))],
                f"{bare_name}, same message rate ({m['latency_rate_messages']:,.0f}/s)",
                tgt,
                higher_is_better=False,
            )
        )
    raw_append = m["raw_append_us"]
    for i, q in enumerate(("p50", "p99")):
        tgt = None
        if q == "p99" and of_record:
            tgt = Target("journal append p99 <= 200 us", 200.0, on="figure", at_least=False)
        rows.append(
            Row.paired(
                f"{label}: journal append {q} (server side, one append per message)",
                "us",
                [m["journal_append_us"][i]],
                [raw_append[i]],
                "os.write of the same message bytes to an O_APPEND file",
                tgt,
                higher_is_better=False,
            )
        )
    return rows


def points(quick: bool) -> list[dict[str, Any]]:
    """The chosen points, each with its message size (built here once)."""
    chosen = os.environ.get("UNDERSTUDY_BENCH_BATCH_TRANSPORTS", "")
    kinds = [k for k in chosen.split(",") if k] or [*BATCHED, "worst", "stream"]
    sizes_env = os.environ.get("UNDERSTUDY_BENCH_BATCH_SIZES", "")
    sizes = tuple(int(s) for s in sizes_env.split(",") if s) or SIZES
    out: list[dict[str, Any]] = []
    for kind in kinds:
        if kind in BATCHED:
            out += [{"transport": kind, "shape": "record", "batch": b} for b in sizes]
        elif kind == "worst":
            out.append({"transport": "mstream", "shape": "worst", "batch": RECORD_BATCH})
        elif kind == "stream":
            out.append({"transport": "stream", "shape": "record", "batch": 1})
        else:
            raise ValueError(f"unknown batch benchmark transport {kind!r}")
    for p in out:
        if p["transport"] == "stream":
            body = workload.protobuf_templates(workload.requests(1))[0].body("raw", 0)
            p["snapshots"] = 1
        else:
            t = batch_workload.templates(int(p["batch"]), str(p["shape"]), count=1)[0]
            body = t.body("raw", 0)
            p["snapshots"] = t.snapshots
        p["bytes"] = len(body)
        # at most ~256 MB written, so page-cache writeback does not make the raw figure
        n = max(200, min(2_000 if quick else 10_000, (256 << 20) // len(body)))
        p["raw_append_us"] = raw_append_us(body, n)
    return out


def run(quick: bool = False) -> BenchResult:
    """Measure every point; one result with every row."""
    plan = Plan(quick)
    chosen = points(quick)
    gen = Generator()
    bare: dict[str, Server] = {}
    measured = []
    try:
        for p in chosen:
            protocol = PROTOCOL[p["transport"]]
            if protocol not in bare:
                probe = next(
                    (
                        q
                        for q in chosen
                        if PROTOCOL[q["transport"]] == protocol and q["batch"] == RECORD_BATCH
                    ),
                    p,
                )
                bare[protocol] = _bare_kind(gen, protocol, probe, plan)
            measured.append(measure(gen, bare[protocol], p, plan))
    finally:
        for s in bare.values():
            s.stop()
        gen.stop()
    rows = [r for m in measured for r in _rows(m)]
    details = {
        "cores": {"server": sorted(server_cpus()), "generator": sorted(cpu_split()[1])},
        "points": measured,
    }
    return BenchResult("batch_ingest", rows, details)
