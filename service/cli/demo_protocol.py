"""The demo's shadow protocol: started like an operator starts one, watched as it runs.

`understudy demo` starts ``protocols/first-fit-shadow.yaml`` over the
service's own HTTP API (``POST /v1/protocols/{id}/versions/1/start`` with an
owner's admin token), before any traffic: the protocol is predeclared and its
hash is locked when it starts. The evaluator in the service (the one
``build_service`` wires) then judges it on every tick. `ProtocolWatch` reads
what the evaluator publishes, never computes a verdict itself:

- the criterion's value, bound and sample count from the service's metrics
  (``understudy_experiment_criterion_*``), for the live view;
- the protocol's state and its stop event from the protocol store
  (PostgreSQL), so what is printed is what was recorded.

`ProtocolWatch.settle` waits until the evaluator has run two full ticks after
the last outcome was joined (the first may have started before), so the
demo's last word on the protocol covers all of its traffic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from service.protocols import ProtocolEvent, State
from service.server.runtime import Service
from service.storage import ProtocolStore

PROTOCOL_FILE = Path(__file__).resolve().parents[2] / "protocols" / "first-fit-shadow.yaml"
"""The predeclared protocol the demo starts (its candidate is a registered baseline)."""
OWNER = "demo"
"""The principal that starts it: one of the protocol's `owners`."""
CRITERION = "reward-harm"
"""The stop criterion the live view follows."""
SETTLE_TIMEOUT_S = 120.0
"""Hang guard for `settle` only: two evaluator ticks take a few seconds on 2 busy cores."""


def load_protocol(path: Path = PROTOCOL_FILE) -> dict[str, Any]:
    """The protocol document as written in the file."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def _metric(service: Service, name: str, labels: Mapping[str, str]) -> float | None:
    value = service.metrics.registry.get_sample_value(name, dict(labels))
    return None if value is None else float(value)


@dataclass
class ProtocolWatch:
    """One running protocol as the evaluator reports it (module docstring)."""

    service: Service
    document: Mapping[str, Any]
    stop_event: ProtocolEvent | None = None
    _state: State | None = field(default=None, repr=False)

    @property
    def protocol_id(self) -> str:
        """The protocol's id (from its file)."""
        return str(self.document["id"])

    @property
    def version(self) -> int:
        """The protocol's version (from its file)."""
        return int(self.document["version"])

    @property
    def candidate(self) -> str:
        """``name@version`` of the candidate under test."""
        c = self.document["candidate"]
        return f"{c['policy']}@{c['version']}"

    @property
    def experiment(self) -> str:
        """The ``experiment`` label of its metrics."""
        return f"{self.protocol_id}@{self.version}"

    def start(self, admin_token: str) -> str:
        """Start it through the HTTP API, as its owner would; the locked content hash."""
        response = httpx.post(
            f"http://127.0.0.1:{self.service.http_port}/v1/protocols/"
            f"{self.protocol_id}/versions/{self.version}/start",
            json={"reason": "understudy demo", "document": dict(self.document)},
            headers={"authorization": f"Bearer {admin_token}"},
            timeout=30,
        )
        if response.status_code != 200:
            raise RuntimeError(
                f"starting `{self.protocol_id}` was refused: {response.status_code} {response.text}"
            )
        self._state = State.RUNNING
        return str(response.json()["content_sha256"])

    def _store(self) -> ProtocolStore:
        assert self.service.engine is not None
        return ProtocolStore(self.service.engine)

    def state(self) -> State | None:
        """The protocol's state as recorded in the store."""
        record = self._store().find(self.protocol_id, self.version)
        return None if record is None else record.state

    def poll(self) -> ProtocolEvent | None:
        """The stop (or other ending) event, once, when the store first shows it."""
        if self._state is not State.RUNNING:
            return None
        state = self.state()
        if state is None or state is State.RUNNING:
            return None
        self._state = state
        self.stop_event = self._store().events(self.protocol_id, self.version)[-1]
        return self.stop_event

    def criterion_line(self) -> str:
        """The stop criterion now, from the evaluator's metrics: value, bound, samples."""
        labels = {"experiment": self.experiment, "criterion": CRITERION}
        n = _metric(self.service, "understudy_experiment_criterion_samples", labels)
        value = _metric(self.service, "understudy_experiment_criterion_value", labels)
        bound = _metric(self.service, "understudy_experiment_criterion_bound", labels)
        head = f"protocol {self.protocol_id}"
        if self._state is not None and self._state is not State.RUNNING:
            return f"{head}: {self._state.value}"
        if n is None:
            return f"{head}: running, before the evaluator's first look"
        if value is None or bound is None or math.isnan(value) or math.isnan(bound):
            return f"{head}: running, n={n:.0f} (a verdict needs {self.minimum_samples})"
        return (
            f"{head}: n={n:.0f}, candidate − production {value:+.3f}, "
            f"upper bound {bound:+.3f} (stops < 0)"
        )

    @property
    def minimum_samples(self) -> int:
        """Joined rounds before any verdict (from the protocol)."""
        return int(self.document.get("minimum_samples", 0))

    def ticks(self) -> float:
        """Evaluator ticks so far (every result)."""
        total = 0.0
        for metric in self.service.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == "understudy_evaluator_ticks_total":
                    total += sample.value
        return total

    def settle(self, announce: Callable[[ProtocolEvent], None]) -> str | None:
        """Wait for two full evaluator ticks after now, passing a stop found meanwhile to
        `announce`; None, or what was seen when the hang guard ran out."""
        if self._state is not State.RUNNING:
            return None
        target = self.ticks() + 2
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.ticks() < target:
            if (event := self.poll()) is not None:
                announce(event)
                return None
            if time.monotonic() > deadline:
                return (
                    f"the evaluator ran {self.ticks() - target + 2:.0f} of 2 ticks in "
                    f"{SETTLE_TIMEOUT_S:.0f}s; last seen: {self.criterion_line()}"
                )
            time.sleep(0.2)
        if (event := self.poll()) is not None:
            announce(event)
        return None


def describe_stop(event: ProtocolEvent, candidate: str) -> list[str]:
    """The stop event in words: criterion, value, bound, rounds, and what follows."""
    judged = event.evidence.get("criterion", {})
    name = candidate.split("@")[0]
    lines = [
        f"[bold red]{event.action.value.upper()}[/] {event.protocol_id} v{event.version} "
        f"on `{event.criterion}`, by {event.actor}"
    ]
    value, bound = judged.get("value"), judged.get("bound")
    if value is not None and bound is not None:
        lines += [
            f"  {name} − production {value:+.3f} SLO met per request; upper bound "
            f"{bound:+.3f} < {judged.get('threshold', 0.0):g}",
            f"  anytime-valid ({judged.get('method')}, alpha {judged.get('alpha')}), "
            f"after {judged.get('n')} joined rounds",
        ]
    else:
        lines.append(f"  {event.reason}")
    lines.append(f"  {name} is no longer scored; the others go on; nothing goes to Runtime")
    return lines
