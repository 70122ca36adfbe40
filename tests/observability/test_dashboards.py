"""The committed dashboards are the generator's output and use only real metrics."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from service.metrics import ServiceMetrics
from tests.observability.dashboards import (
    DASHBOARDS,
    GRAFANA_DIR,
    alert_exprs,
    generator,
    load,
    queries,
    variables,
)

_METRIC = re.compile(r"\bunderstudy_[a-z_]+\b")


def _exported_names() -> set[str]:
    """Every sample name the service exports (counters with `_total`, histogram parts)."""
    names = set()
    for family in ServiceMetrics(CollectorRegistry()).registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "count", "sum")}
    return names


def test_committed_json_is_the_generators_output() -> None:
    rendered = generator().dashboards()
    assert sorted(rendered) == sorted(DASHBOARDS)
    for name, text in rendered.items():
        committed = (GRAFANA_DIR / "dashboards" / name).read_text()
        assert committed == text, f"{name} is stale: run python docker/grafana/generate.py"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_uses_only_metrics_the_service_exports(name: str) -> None:
    exported = _exported_names()
    for query in queries(name):
        unknown = set(_METRIC.findall(query.expr)) - exported
        assert not unknown, f"{name} / {query.panel}: unknown metrics {sorted(unknown)}"
    for variable in variables(load(name)):
        assert variable.metric in exported, f"{name}: `${variable.name}` reads {variable.metric}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_variable_a_panel_uses_is_declared(name: str) -> None:
    declared = {v.name for v in variables(load(name))}
    for query in queries(name):
        assert query.variables <= declared, f"{name} / {query.panel}: {query.variables - declared}"


def test_every_alert_uses_only_metrics_the_service_exports() -> None:
    exported = _exported_names()
    for alert, expr in alert_exprs().items():
        unknown = set(_METRIC.findall(expr)) - exported
        assert not unknown, f"{alert}: unknown metrics {sorted(unknown)}"


def test_dashboards_have_the_replica_policy_and_experiment_variables() -> None:
    assert {v.name for v in variables(load("oncall.json"))} == {"instance", "policy"}
    assert {v.name for v in variables(load("experiments.json"))} == {
        "experiment",
        "policy",
        "instance",
    }
