"""`understudy serve` with the evaluator wired: a replica for the two-process leadership test.

Does what `service.server.app.serve` does (build, start, print one JSON line with
the ports, run until SIGTERM), plus `wire_evaluator` with test timings from
the environment and one test seam: before applying a verdict it writes
``$EVAL_MARKER`` (pid, action, criterion) and then waits until the test
creates ``$EVAL_MARKER.go`` (and consumes it), so the test can SIGSTOP it
right there — between deciding and applying, where fencing matters — and
choose which replica applies first, however slow the machine. No time
window: the wait ends on the file (a 600 s bound only keeps a forgotten
replica from hanging).

``UNDERSTUDY_EVALUATOR_ENABLED=false`` is set by the test, so a composition
root that wires its own evaluator leaves it to this one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from service.evaluator.loop import EvaluatorConfig
from service.protocols import RecordedProtocol
from service.protocols.verdicts import Verdict
from service.server.app import build_service
from service.server.evaluator_wiring import wire_evaluator
from service.settings import Settings


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    marker = Path(os.environ["EVAL_MARKER"])
    go = marker.with_name(marker.name + ".go")

    def before_apply(record: RecordedProtocol, verdict: Verdict) -> None:
        marker.write_text(f"{os.getpid()} {verdict.action.value} {verdict.criterion}")
        bound = time.monotonic() + 600.0
        while not go.exists() and time.monotonic() < bound:
            time.sleep(0.02)  # poll interval of a condition wait (the test's go file)
        go.unlink(missing_ok=True)

    service = build_service(Settings())
    evaluator = wire_evaluator(
        service,
        EvaluatorConfig(
            interval_s=float(os.environ["EVAL_INTERVAL_S"]),
            lease_ttl_s=float(os.environ["EVAL_LEASE_TTL_S"]),
        ),
        before_apply=before_apply,
        holder=os.environ["EVAL_HOLDER"],
    )
    service.start()
    service.wait_started()
    evaluator.start()
    print(json.dumps({"event": "listening", "http_port": service.http_port}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        service.update_health()
    evaluator.stop()
    service.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
