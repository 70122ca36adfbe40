"""The demo's live view and closing tables, read from the service's own metrics and log."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import httpx
from rich.console import Group
from rich.table import Table

from service.client import ClientStats
from service.server.runtime import Service
from service.storage import (
    count_dangling_outcomes,
    count_joined_outcomes,
    count_requests,
    policy_summaries,
)


def summed(service: Service, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for metric in service.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _policies(service: Service) -> list[str]:
    return sorted(service.policies.policies) if service.policies is not None else []


@dataclass
class LiveView:
    """Renders ingest rate, journal depth, decisions, agreement, outcomes and the protocol.

    `protocol` gives the line about the running protocol (the evaluator's stop
    criterion as its metrics show it); None leaves the line out.
    """

    service: Service
    protocol: Callable[[], str] | None = None
    started: float = field(default_factory=time.monotonic)
    _last: tuple[float, float] = (0.0, 0.0)

    def render(self, client: ClientStats, sent: int, total: int) -> Group:
        """One frame of the live view."""
        now = time.monotonic()
        accepted = summed(self.service, "understudy_ingest_total", kind="mirror", result="accepted")
        last_t, last_n = self._last
        rate = (accepted - last_n) / (now - last_t) if last_t else 0.0
        self._last = (now, accepted)
        head = Table.grid(padding=(0, 3))
        head.add_row(
            f"[bold]simulated Runtime[/] {sent}/{total} events",
            f"ingest {rate:,.0f} req/s",
            f"journal depth {self.service.journal.depth_records('scorer')}",
            f"client dropped {client.mirrors.dropped + client.outcomes.dropped}, "
            f"reconnects {client.reconnects}, "
            f"batches {client.mirror_batches.batches_sent} "
            f"(mean {client.mirror_batches.mean_requests:.1f} requests)",
        )
        on_arrival = summed(self.service, "understudy_outcomes_total", state="joined_on_arrival")
        parked = summed(self.service, "understudy_outcomes_total", state="parked")
        later = summed(self.service, "understudy_outcomes_total", state="joined_from_parked")
        joined, waiting = on_arrival + later, parked - later
        outcomes = Table.grid(padding=(0, 3))
        outcomes.add_row(
            f"outcomes joined {joined:.0f}",
            f"outcomes waiting for their request {waiting:.0f}",
            f"elapsed {now - self.started:.0f}s",
        )
        table = Table("policy", "decisions", "ok", "agrees", "fav. masked")
        for name in _policies(self.service):
            decisions = summed(self.service, "understudy_decisions_total", policy=name)
            agreed = summed(
                self.service, "understudy_production_agreement_total", policy=name, agrees="true"
            )
            compared = summed(self.service, "understudy_production_agreement_total", policy=name)
            masked = summed(self.service, "understudy_raw_favourite_infeasible_total", policy=name)
            ok = summed(self.service, "understudy_decisions_total", policy=name, status="ok")
            table.add_row(
                name,
                f"{decisions:.0f}",
                f"{ok:.0f}",
                f"{agreed / compared:.0%}" if compared else "-",
                f"{masked:.0f}",
            )
        if self.protocol is None:
            return Group(head, outcomes, table)
        return Group(head, outcomes, self.protocol(), table)


def closing_tables(
    service: Service, accepted: float, stopped: Mapping[str, str] | None = None
) -> tuple[Table, list[str]]:
    """Each candidate vs production from the decision log, and the consistency checks.

    `stopped` maps a policy the evaluator stopped to why: it has fewer decisions than
    there are requests, on purpose, and the check says so instead of flagging it.
    """
    stopped = stopped or {}
    assert service.engine is not None
    engine = service.engine
    requests = count_requests(engine)
    table = Table(
        title=f"Each candidate vs production ({requests} requests in the log)",
    )
    table.add_column("policy", no_wrap=True)
    for header in ("decisions", "agrees", "errors", "fav. masked", "us/dec."):
        table.add_column(header, justify="right")
    checks = []
    summaries = policy_summaries(engine)
    for s in summaries:
        table.add_row(
            s.policy,
            str(s.decisions),
            f"{s.agreement:.1%}" if s.agreement is not None else "n/a",
            str(s.errors),
            f"{s.infeasible_favourites / max(s.ok, 1):.1%}",
            f"{s.mean_latency_us:.0f}",
        )
        if s.decisions != requests and s.policy in stopped:
            checks.append(
                f"[yellow]{s.policy}: {s.decisions} decisions for {requests} requests: "
                f"{stopped[s.policy]}[/]"
            )
        elif s.decisions != requests:
            checks.append(f"[red]{s.policy}: {s.decisions} decisions for {requests} requests[/]")
    if requests != int(accepted):
        checks.append(f"[red]{requests} requests logged, {accepted:.0f} accepted[/]")
    if summaries:
        checks.append(
            f"{summaries[0].all_infeasible} of {requests} requests had no feasible option: "
            "the fleet was full, Runtime could only defer (and retry later), every policy "
            "defers too, and 'agrees' counts those; 'fav. masked' is the share of decisions "
            "with a choice whose top-scored option was infeasible (masked, never chosen)"
        )
    mirror = next((s for s in summaries if s.policy == "production-mirror"), None)
    if mirror is not None and mirror.errors:
        checks.append(
            f"production-mirror's {mirror.errors} 'errors' are requests mirrored before "
            "Runtime decided (one episode in four, on purpose): it can only copy a decision "
            "it has seen. Not failures: the decision comes later with the outcome, and "
            "off-policy estimation uses it"
        )
    checks.append(
        f"outcomes joined: {count_joined_outcomes(engine)}, "
        f"still waiting for their request: {count_dangling_outcomes(engine)}"
    )
    if not any(c.startswith(("[red]", "[yellow]")) for c in checks):
        checks.insert(
            0, f"[green]every accepted request ({requests}) has a decision from every policy[/]"
        )
    elif not any(c.startswith("[red]") for c in checks):
        checks.insert(
            0,
            f"[green]every accepted request ({requests}) has a decision from every policy "
            "still being scored[/]",
        )
    return table, checks


MASKS_SHOWN = 4
"""Masked options the demo's closing lines name (of the first request that has any)."""


def mask_lines(base_url: str, reviewer_token: str, request_ids: Iterable[str]) -> list[str]:
    """Why options were masked, as a reviewer reads it: the first of `request_ids` with a
    masked option, from ``GET /v1/reviewer/requests/{id}/feasibility`` over HTTP.

    Each line names an option, its nodes and the signals the log recorded
    (e.g. ``option 7 (node n17): masked by accelerator_share, memory``).
    """
    headers = {"authorization": f"Bearer {reviewer_token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
        for request_id in request_ids:
            reply = http.get(f"/v1/reviewer/requests/{request_id}/feasibility")
            if reply.status_code != 200:
                return [f"[yellow]reviewer API: {reply.status_code} {reply.text[:120]}[/]"]
            body = reply.json()
            masked = [o for o in body["options"] if o["feasible"] is False]
            if not masked:
                continue
            lines = [
                f"why options were masked ({body['version']}, as the reviewer API shows it: "
                f"GET /v1/reviewer/requests/{request_id}/feasibility): "
                f"{len(masked)} of {len(body['options'])} options of {request_id}"
            ]
            for o in masked[:MASKS_SHOWN]:
                nodes = ", ".join(o["nodes"])
                noun = "node" if len(o["nodes"]) == 1 else "nodes"
                why = ", ".join(o["signals"] or ["unnamed signals"])
                lines.append(f"  option {o['option']} ({noun} {nodes}): masked by {why}")
            return lines
    return ["no masked option in the requests looked at"]
