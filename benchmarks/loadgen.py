"""The load generator: its own process, driven by JSON lines on stdin.

``python -m benchmarks.loadgen`` reads one command per line and answers one
JSON line per command, so the (slow) imports and body templates are paid once.
A command: ``{"transport": "stream"|"unary"|"http", "port": P, "token": T,
"mode": "closed"|"open", "rate": R, "duration": D, "tag": "a1", "window": W}``.

Closed loop keeps `window` messages in flight and reports the acked rate.
Open loop sends on a schedule fixed in advance (message i at ``t0 + i/R``)
and measures each ack from its *scheduled* time, so a stall on either side
shows up as latency instead of silently slowing the sender (coordinated
omission). ``send_lag`` says how far the sender itself fell behind.

Loopback only; every run is bounded by `duration` plus a fixed drain timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from benchmarks import workload
from service.wire.understudy.v1 import shadow_pb2

STREAM = "/understudy.v1.ShadowEvaluation/MirrorStream"
UNARY = "/understudy.v1.ShadowEvaluation/Mirror"
DRAIN_S = 15.0


def due_or_sleep(started: float, i: int, rate: float, now: float) -> float | None:
    """Open loop: message `i`'s scheduled send time if it has come; else sleep a slice
    (at most 2 ms, so a late schedule is caught up at once) and return None."""
    due = started + i / rate
    if due > now:
        time.sleep(min(due - now, 0.002))
        return None
    return due


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response off a kept-alive connection: (status, body)."""
    header = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in header.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return int(header[9:12]), await reader.readexactly(length)


ACCEPTED, SHED = shadow_pb2.ACK_STATUS_ACCEPTED, shadow_pb2.ACK_STATUS_SHED


@dataclass
class Command:
    """One run."""

    transport: str
    port: int
    token: str
    mode: str
    duration: float
    tag: str
    rate: float = 0.0
    window: int = 512
    connections: int = 32
    options: int = workload.N_OPTIONS


class Tally:
    """Per-message schedule, ack times and fates; summarised at the end."""

    def __init__(self, capacity: int) -> None:
        self.sched = np.full(capacity, np.nan)
        self.sent = np.full(capacity, np.nan)
        self.acked = np.full(capacity, np.nan)
        self.n = 0
        self.shed = 0
        self.rejected = 0
        self.errors = 0

    def summary(self, started: float, duration: float, mode: str) -> dict[str, Any]:
        n = self.n
        done = np.isfinite(self.acked[:n])
        acked = int(done.sum())
        out: dict[str, Any] = {
            "sent": n,
            "acked": acked,
            "accepted": acked - self.shed - self.rejected,
            "shed": self.shed,
            "rejected": self.rejected,
            "errors": self.errors,
            "unacked": n - acked,
            "duration_s": duration,
        }
        if mode == "closed":
            in_window = done & (self.acked[:n] <= started + duration)
            out["ack_rate"] = float(in_window.sum()) / duration
            return out
        lat = (self.acked[:n] - self.sched[:n])[done] * 1e3
        lag = (self.sent[:n] - self.sched[:n])[np.isfinite(self.sent[:n])] * 1e3
        out["ack_rate"] = acked / duration
        if len(lat):
            p50, p99, p999 = np.percentile(lat, [50, 99, 99.9])
            out |= {"p50_ms": p50, "p99_ms": p99, "p999_ms": p999, "max_ms": float(lat.max())}
        if len(lag):
            out |= {"send_lag_p99_ms": float(np.percentile(lag, 99))}
        return out


class Generator:
    """Holds the body templates; runs commands."""

    def __init__(self) -> None:
        self._templates: dict[int, tuple[list[workload.Template], list[workload.Template]]] = {}
        self.use(workload.N_OPTIONS)

    def use(self, options: int) -> None:
        """Bodies with up to `options` placement options (built once per count)."""
        if options not in self._templates:
            reqs = workload.requests(64, options=options)
            self._templates[options] = (
                workload.protobuf_templates(reqs),
                workload.json_templates(reqs),
            )
        self.pb, self.json = self._templates[options]

    def run(self, cmd: Command) -> dict[str, Any]:
        self.use(cmd.options)
        cap = int(max(cmd.rate, 1) * cmd.duration * 1.05) + 10 if cmd.mode == "open" else 4_000_000
        if cmd.mode == "closed":
            cap = min(cap, 60_000 * int(cmd.duration + 1))
        tally = Tally(cap)
        cpu0 = _cpu()
        started = time.perf_counter()
        if cmd.transport == "stream":
            self._stream(cmd, tally, started)
        elif cmd.transport == "unary":
            self._unary(cmd, tally, started)
        else:
            asyncio.run(self._http(cmd, tally, started))
        out = tally.summary(started, cmd.duration, cmd.mode)
        out["generator_cpu_s"] = _cpu() - cpu0
        out["generator_cores"] = out["generator_cpu_s"] / max(cmd.duration, 1e-9)
        return out

    # ------------------------------------------------------------------ gRPC stream
    def _stream(self, cmd: Command, t: Tally, started: float) -> None:
        cond = threading.Condition()
        state = {"through": 0}
        end = started + cmd.duration

        def requests() -> Iterator[bytes]:
            i = 0
            while i < len(t.sched):
                now = time.perf_counter()
                if now >= end:
                    return
                if cmd.mode == "open":
                    if (due := due_or_sleep(started, i, cmd.rate, now)) is None:
                        continue
                else:
                    with cond:
                        while i - state["through"] >= cmd.window and time.perf_counter() < end:
                            cond.wait(0.05)
                    due = time.perf_counter()
                t.sched[i] = due
                t.sent[i] = time.perf_counter()
                body = self.pb[i % len(self.pb)].body(cmd.tag, i)
                i += 1
                t.n = i
                yield workload.stream_envelope(i, body)

        with grpc.insecure_channel(f"127.0.0.1:{cmd.port}") as channel:
            call = channel.stream_stream(STREAM)
            meta = (("authorization", f"Bearer {cmd.token}"),)
            responses = call(requests(), metadata=meta, timeout=cmd.duration + DRAIN_S)
            try:
                for raw in responses:
                    ack = shadow_pb2.StreamAck.FromString(raw)
                    now = time.perf_counter()
                    seq = int(ack.sequence)
                    if ack.status == ACCEPTED:
                        lo = state["through"]
                        if seq > lo:
                            t.acked[lo:seq] = now
                            with cond:
                                state["through"] = seq
                                cond.notify()
                    else:
                        t.shed += ack.status == SHED
                        t.rejected += ack.status != SHED
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    t.errors += 1

    # ------------------------------------------------------------------ gRPC unary
    def _unary(self, cmd: Command, t: Tally, started: float) -> None:
        meta = (("authorization", f"Bearer {cmd.token}"),)
        end = started + cmd.duration
        window = threading.Semaphore(cmd.window if cmd.mode == "closed" else 20_000)
        with grpc.insecure_channel(f"127.0.0.1:{cmd.port}") as channel:
            call = channel.unary_unary(UNARY)

            def done(future: Any, i: int) -> None:
                now = time.perf_counter()
                try:
                    status = shadow_pb2.MirrorAck.FromString(future.result()).status
                    t.acked[i] = now
                    if status == SHED:
                        t.shed += 1
                except grpc.RpcError:
                    t.errors += 1
                window.release()

            i = 0
            pending = []
            while i < len(t.sched):
                now = time.perf_counter()
                if now >= end:
                    break
                if cmd.mode == "open":
                    if (due := due_or_sleep(started, i, cmd.rate, now)) is None:
                        continue
                else:
                    due = now
                if not window.acquire(timeout=0.1):
                    continue
                t.sched[i] = due
                t.sent[i] = time.perf_counter()
                body = self.pb[i % len(self.pb)].body(cmd.tag, i)
                future = call.future(body, metadata=meta, timeout=DRAIN_S)
                future.add_done_callback(lambda f, i=i: done(f, i))
                pending.append(future)
                i += 1
                t.n = i
            deadline = time.perf_counter() + DRAIN_S
            for f in pending:
                with contextlib.suppress(Exception):  # counted as an error in `done`
                    f.result(timeout=max(0.0, deadline - time.perf_counter()))

    # ------------------------------------------------------------------ HTTP
    async def _http(self, cmd: Command, t: Tally, started: float) -> None:
        end = started + cmd.duration
        queue: asyncio.Queue[int] = asyncio.Queue()
        head = (
            f"POST /v1/mirror HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {cmd.token}"
            "\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        counter = {"next": 0}

        async def worker() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", cmd.port)
            try:
                while True:
                    if cmd.mode == "open":
                        i = await queue.get()
                        if i < 0:
                            return
                    else:
                        if time.perf_counter() >= end or counter["next"] >= len(t.sched):
                            return
                        i = counter["next"]
                        counter["next"] += 1
                        t.sched[i] = time.perf_counter()
                        t.n = max(t.n, i + 1)
                    body = self.json[i % len(self.json)].body(cmd.tag, i)
                    t.sent[i] = time.perf_counter()
                    writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                    code, payload = await read_response(reader)
                    if code == 202 and b"shed" not in payload:
                        t.acked[i] = time.perf_counter()
                    elif code == 202:
                        t.acked[i] = time.perf_counter()
                        t.shed += 1
                    else:
                        t.errors += 1
            except (OSError, asyncio.IncompleteReadError):
                t.errors += 1
            finally:
                writer.close()

        workers = [asyncio.create_task(worker()) for _ in range(cmd.connections)]
        if cmd.mode == "open":
            i = 0
            while i < len(t.sched):
                now = time.perf_counter()
                if now >= end:
                    break
                due = started + i / cmd.rate
                if due > now:
                    await asyncio.sleep(min(due - now, 0.002))
                    continue
                t.sched[i] = due
                queue.put_nowait(i)
                i += 1
                t.n = i
            for _ in workers:
                queue.put_nowait(-1)
        await asyncio.wait(workers, timeout=cmd.duration + DRAIN_S)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Answer commands until stdin closes."""
    gen = Generator()
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = gen.run(Command(**json.loads(line)))
        except Exception as exc:  # report, keep serving: the orchestrator decides
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
