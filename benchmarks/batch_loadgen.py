"""The batch load generator: its own process, driven by JSON lines on stdin.

``python -m benchmarks.batch_loadgen`` answers one JSON line per command. A
command: ``{"transport": "mstream"|"many"|"hbatch"|"stream", "port": P,
"token": T, "mode": "closed"|"open", "rate": R (messages/s), "duration": D,
"tag": "a1", "batch": B, "shape": "record"|"worst", "window": W}``.

``mstream`` is one gRPC ``MirrorManyStream`` (cumulative acks), ``many`` unary
``MirrorMany`` calls, ``hbatch`` ``POST /v1/mirror/batch`` with
``application/x-protobuf``; ``stream`` (the single-request ``MirrorStream``) is
`benchmarks.loadgen`'s, so the unbatched figure is the e2e benchmark's path.

As in `benchmarks.loadgen`: closed loop keeps `window` messages in flight and
reports the acked rate; open loop sends message i at ``t0 + i/R`` and measures
each ack from its *scheduled* time (no coordinated omission). Rates here are
*requests* per second (accepted requests acked within the window); latencies
are per message (a batch's requests share its ack).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

from benchmarks import batch_workload, loadgen
from benchmarks.batch_workload import BatchTemplate
from service.wire.understudy.v1 import shadow_pb2

MANY_STREAM = "/understudy.v1.ShadowEvaluation/MirrorManyStream"
MANY = "/understudy.v1.ShadowEvaluation/MirrorMany"
DRAIN_S = 15.0
ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
]


class Tally:
    """Per-message schedule and ack times, per-request fates."""

    def __init__(self, capacity: int, batch: int) -> None:
        self.sched = np.full(capacity, np.nan)
        self.acked = np.full(capacity, np.nan)
        self.accepted = np.zeros(capacity, dtype=np.int64)
        self.batch = batch
        self.n = 0
        self.shed = 0
        self.rejected = 0
        self.errors = 0

    def ack(self, i: int, now: float, accepted: int, shed: int = 0, rejected: int = 0) -> None:
        self.acked[i] = now
        self.accepted[i] = accepted
        self.shed += shed
        self.rejected += rejected

    def summary(self, started: float, duration: float, mode: str) -> dict[str, Any]:
        n = self.n
        done = np.isfinite(self.acked[:n])
        out: dict[str, Any] = {
            "messages": n,
            "sent": n * self.batch,
            "acked_messages": int(done.sum()),
            "accepted": int(self.accepted[:n].sum()),
            "shed": self.shed,
            "rejected": self.rejected,
            "errors": self.errors,
            "unacked": int((~done).sum()) * self.batch,
            "duration_s": duration,
            "batch": self.batch,
        }
        if mode == "closed":
            in_window = done & (self.acked[:n] <= started + duration)
            out["ack_rate"] = float(self.accepted[:n][in_window].sum()) / duration
            out["message_rate"] = float(in_window.sum()) / duration
            return out
        out["ack_rate"] = float(self.accepted[:n].sum()) / duration
        lat = (self.acked[:n] - self.sched[:n])[done] * 1e3
        if len(lat):
            p50, p99, p999 = np.percentile(lat, [50, 99, 99.9])
            out |= {"p50_ms": p50, "p99_ms": p99, "p999_ms": p999, "max_ms": float(lat.max())}
        return out


class Generator:
    """Holds the batch templates (built once per batch size and shape); runs commands."""

    def __init__(self) -> None:
        self._templates: dict[tuple[int, str], list[BatchTemplate]] = {}
        self._single = loadgen.Generator()

    def templates(self, batch: int, shape: str) -> list[BatchTemplate]:
        key = (batch, shape)
        if key not in self._templates:
            self._templates[key] = batch_workload.templates(batch, shape)
        return self._templates[key]

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["transport"] == "stream":
            single = {k: cmd[k] for k in ("transport", "port", "token", "mode", "duration", "tag")}
            out = self._single.run(
                loadgen.Command(**single, rate=cmd.get("rate", 0.0), window=cmd.get("window", 1024))
            )
            out["batch"] = 1
            out["message_rate"] = out["ack_rate"]
            return out
        batch, shape = int(cmd["batch"]), cmd.get("shape", "record")
        bodies = self.templates(batch, shape)
        rate = float(cmd.get("rate", 0.0))
        duration = float(cmd["duration"])
        if cmd["mode"] == "open":
            cap = int(max(rate, 1) * duration * 1.05) + 10
        else:
            cap = 2_000_000 // batch + 1000
        tally = Tally(cap, batch)
        cpu0 = time.process_time()
        started = time.perf_counter()
        args = (cmd, bodies, tally, started)
        if cmd["transport"] == "mstream":
            self._stream(*args)
        elif cmd["transport"] == "many":
            self._unary(*args)
        elif cmd["transport"] == "hbatch":
            asyncio.run(self._http(*args))
        else:
            raise ValueError(f"unknown transport {cmd['transport']!r}")
        out = tally.summary(started, duration, cmd["mode"])
        out["generator_cpu_s"] = time.process_time() - cpu0
        out["generator_cores"] = out["generator_cpu_s"] / max(duration, 1e-9)
        out["message_bytes"] = bodies[0].size
        out["snapshots"] = bodies[0].snapshots
        return out

    @staticmethod
    def _due(cmd: dict[str, Any], started: float, i: int) -> float:
        return started + i / float(cmd["rate"])

    # ------------------------------------------------------------------ gRPC batch stream
    def _stream(
        self, cmd: dict[str, Any], bodies: list[BatchTemplate], t: Tally, started: float
    ) -> None:
        cond = threading.Condition()
        state = {"through": 0}  # messages 0 .. through-1 are acked
        end = started + float(cmd["duration"])
        window = int(cmd.get("window", 64))
        tag, open_loop = cmd["tag"], cmd["mode"] == "open"

        def requests() -> Iterator[bytes]:
            i = 0
            while i < len(t.sched):
                now = time.perf_counter()
                if now >= end:
                    return
                if open_loop:
                    if (due := loadgen.due_or_sleep(started, i, float(cmd["rate"]), now)) is None:
                        continue
                else:
                    with cond:
                        while i - state["through"] >= window and time.perf_counter() < end:
                            cond.wait(0.05)
                    due = time.perf_counter()
                t.sched[i] = due
                body = bodies[i % len(bodies)].body(tag, i)
                i += 1
                t.n = i
                yield batch_workload.batch_envelope(i, body)  # sequence i+1 for message i

        with grpc.insecure_channel(f"127.0.0.1:{cmd['port']}", options=CHANNEL_OPTIONS) as ch:
            call = ch.stream_stream(MANY_STREAM)
            meta = (("authorization", f"Bearer {cmd['token']}"),)
            responses = call(requests(), metadata=meta, timeout=float(cmd["duration"]) + DRAIN_S)
            try:
                for raw in responses:
                    ack = shadow_pb2.BatchStreamAck.FromString(raw).ack
                    now = time.perf_counter()
                    seq = int(ack.sequence)
                    if ack.status == ACCEPTED and not ack.rejections:
                        lo = state["through"]  # cumulative: every batch up to seq wholly accepted
                        for i in range(lo, seq):
                            if not np.isfinite(t.acked[i]):
                                t.ack(i, now, t.batch)
                    elif seq:  # this batch alone
                        t.ack(seq - 1, now, ack.accepted, ack.shed, ack.rejected)
                    else:
                        t.errors += 1
                    if seq > state["through"]:
                        with cond:
                            state["through"] = seq
                            cond.notify()
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    t.errors += 1

    # ------------------------------------------------------------------ gRPC unary batch
    def _unary(
        self, cmd: dict[str, Any], bodies: list[BatchTemplate], t: Tally, started: float
    ) -> None:
        meta = (("authorization", f"Bearer {cmd['token']}"),)
        end = started + float(cmd["duration"])
        open_loop = cmd["mode"] == "open"
        window = threading.Semaphore(20_000 if open_loop else int(cmd.get("window", 16)))
        with grpc.insecure_channel(f"127.0.0.1:{cmd['port']}", options=CHANNEL_OPTIONS) as ch:
            call = ch.unary_unary(MANY)

            def done(future: Any, i: int) -> None:
                now = time.perf_counter()
                try:
                    ack = shadow_pb2.BatchAck.FromString(future.result())
                    t.ack(i, now, ack.accepted, ack.shed, ack.rejected)
                except grpc.RpcError:
                    t.errors += 1
                window.release()

            i, pending = 0, []
            while i < len(t.sched):
                now = time.perf_counter()
                if now >= end:
                    break
                if open_loop:
                    if (due := loadgen.due_or_sleep(started, i, float(cmd["rate"]), now)) is None:
                        continue
                else:
                    due = now
                if not window.acquire(timeout=0.1):
                    continue
                t.sched[i] = due
                body = bodies[i % len(bodies)].body(cmd["tag"], i)
                future = call.future(body, metadata=meta, timeout=DRAIN_S)
                future.add_done_callback(lambda f, i=i: done(f, i))
                pending.append(future)
                i += 1
                t.n = i
            deadline = time.perf_counter() + DRAIN_S
            for f in pending:
                with contextlib.suppress(Exception):  # counted as an error in `done`
                    f.result(timeout=max(0.0, deadline - time.perf_counter()))

    # ------------------------------------------------------------------ HTTP batch
    async def _http(
        self, cmd: dict[str, Any], bodies: list[BatchTemplate], t: Tally, started: float
    ) -> None:
        end = started + float(cmd["duration"])
        open_loop = cmd["mode"] == "open"
        queue: asyncio.Queue[int] = asyncio.Queue()
        head = (
            "POST /v1/mirror/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {cmd['token']}\r\n"
            "Content-Type: application/x-protobuf\r\nContent-Length: "
        ).encode()
        counter = {"next": 0}

        async def worker() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(cmd["port"]))
            try:
                while True:
                    if open_loop:
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
                    body = bodies[i % len(bodies)].body(cmd["tag"], i)
                    writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                    code, payload = await loadgen.read_response(reader)
                    now = time.perf_counter()
                    if code in (200, 400):
                        reply = json.loads(payload)
                        t.ack(i, now, reply["accepted"], reply["shed"], reply["rejected"])
                    else:
                        t.errors += 1
            except (OSError, asyncio.IncompleteReadError):
                t.errors += 1
            finally:
                writer.close()

        workers = [asyncio.create_task(worker()) for _ in range(int(cmd.get("window", 16)))]
        if open_loop:
            i = 0
            while i < len(t.sched):
                now = time.perf_counter()
                if now >= end:
                    break
                due = self._due(cmd, started, i)
                if due > now:
                    await asyncio.sleep(min(due - now, 0.002))
                    continue
                t.sched[i] = due
                queue.put_nowait(i)
                i += 1
                t.n = i
            for _ in workers:
                queue.put_nowait(-1)
        await asyncio.wait(workers, timeout=float(cmd["duration"]) + DRAIN_S)


def main() -> None:
    """Answer commands until stdin closes."""
    gen = Generator()
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = gen.run(json.loads(line))
        except Exception as exc:  # report, keep serving: the orchestrator decides
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
