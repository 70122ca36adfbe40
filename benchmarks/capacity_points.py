"""Cost per mirrored request at several option and policy counts: the capacity model's data.

For each point (options per request K, policies P), the real service is
started with P policies (ONNX and baselines in equal parts, ONNX first) and
fed an open-loop gRPC stream at a fixed moderate rate that the scorer keeps
up with; the CPU seconds the service process and PostgreSQL spend per
request are read from ``/proc`` over the run, after subtracting what both burn
idle (measured first, with no traffic: evaluator, sealer, health loops).
The raw limit is the bare sync stream server's CPU per request at the same
rate, measured in the same run (the transport's own floor).
`service.capacity` fits its model on the first points and checks it on the
last one, which it was not fitted on.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.e2e import Generator, Server, verify
from benchmarks.harness import BenchResult, Row
from benchmarks.procs import cpu_seconds

# (options, onnx policies, baselines); the last point is held out of the fit.
POINTS = ((50, 3, 3), (20, 3, 3), (50, 1, 1), (35, 2, 2))
QUICK_POINTS = ((50, 3, 3), (20, 1, 1))


def _bare_cpu(gen: Generator, rate: float, seconds: float) -> float:
    server = Server("bare-sync", "stream")
    try:
        c0 = cpu_seconds(server.pid)
        res = gen.run("stream", server.port, "open", seconds, rate)
        return (cpu_seconds(server.pid) - c0) / max(res["acked"], 1)
    finally:
        server.stop()


def run(quick: bool = False) -> BenchResult:
    """Measure every point; one row per point."""
    rate = 150.0 if quick else 300.0
    seconds = 4.0 if quick else 6.0
    idle_s = 2.0
    points = QUICK_POINTS if quick else POINTS
    gen = Generator()
    measured: list[dict[str, Any]] = []
    rows = []
    try:
        bare = _bare_cpu(gen, rate, seconds)
        for options, onnx, baselines in points:
            home = Path(tempfile.mkdtemp(prefix="us-bench-cap-"))
            server = Server("understudy", "stream", home, onnx, baselines)
            try:
                c0, t0 = server.cpu(), time.monotonic()
                time.sleep(idle_s)  # background loops (evaluator, sealer, health) cost CPU too
                c1, idle_wall = server.cpu(), time.monotonic() - t0
                gen.run("stream", server.port, "open", 2.0, rate, options=options)  # warm-up
                server.drain(30)
                res = verify(gen, server, "stream", rate, seconds, options)
                res["options"], res["policies"] = options, onnx + baselines
                res["onnx"], res["baselines"] = onnx, baselines
                res["idle_server_cores"] = (c1["server"] - c0["server"]) / idle_wall
                res["idle_postgres_cores"] = (
                    c1.get("postgres", 0) - c0.get("postgres", 0)
                ) / idle_wall
                res["server_cpu_s_per_request"] = (
                    max(res["server_cores"] - res["idle_server_cores"], 0.0) / rate
                )
                res["postgres_cpu_s_per_request"] = (
                    max(res["postgres_cores"] - res["idle_postgres_cores"], 0.0) / rate
                )
                measured.append(res)
            finally:
                server.stop()
                shutil.rmtree(home, ignore_errors=True)
            rows.append(
                Row.paired(
                    f"CPU per request, K={options} options, P={onnx + baselines} policies",
                    "us CPU/request",
                    [res["server_cpu_s_per_request"] * 1e6],
                    [bare * 1e6],
                    "bare sync stream server, same rate",
                    higher_is_better=False,
                    note=f"PostgreSQL {res['postgres_cpu_s_per_request'] * 1e6:.0f} us/request; "
                    f"clean run: {res['ok']}",
                )
            )
    finally:
        gen.stop()
    return BenchResult(
        "capacity",
        rows,
        {
            "rate": rate,
            "seconds": seconds,
            "bare_cpu_s_per_request": bare,
            "points": measured,
            "held_out": list(points[-1]),
        },
    )
