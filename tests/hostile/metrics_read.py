"""Read the service's counters back, summed over the labels a test does not fix."""

from __future__ import annotations

from service.server.app import Service


def counter_sum(service: Service, name: str, **labels: str) -> float:
    """Sum of every sample called `name` whose labels include `labels`."""
    total = 0.0
    for family in service.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def refusals(service: Service, transport: str) -> float:
    """Rejected ingest calls plus refused credentials on one transport."""
    return counter_sum(
        service, "understudy_ingest_total", transport=transport, result="rejected"
    ) + counter_sum(service, "understudy_auth_failures_total", transport=transport)


def ingested(service: Service, transport: str) -> float:
    """Accepted plus shed ingest calls on one transport."""
    return counter_sum(
        service, "understudy_ingest_total", transport=transport, result="accepted"
    ) + counter_sum(service, "understudy_ingest_total", transport=transport, result="shed")
