"""Read the committed dashboards and rules: panels, their PromQL, the variables."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "docker" / "prometheus"
GRAFANA_DIR = REPO / "docker" / "grafana"
DASHBOARDS = ("oncall.json", "experiments.json")

_LABEL_VALUES = re.compile(r"^label_values\((\w+),\s*(\w+)\)$")
_VARIABLE = re.compile(r"\$(\w+)")


@dataclass(frozen=True)
class Variable:
    """A query variable: `label_values(metric, label)`."""

    name: str
    metric: str
    label: str


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    dashboard: str
    panel: str
    expr: str

    @property
    def variables(self) -> set[str]:
        return {v for v in _VARIABLE.findall(self.expr) if not v.startswith("__")}


def generator() -> ModuleType:
    """docker/grafana/generate.py, imported by path (docker/ is not a package)."""
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def load(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((GRAFANA_DIR / "dashboards" / name).read_text())
    return data


def variables(dashboard: dict[str, object]) -> list[Variable]:
    found = []
    for template in dashboard["templating"]["list"]:  # type: ignore[index]
        match = _LABEL_VALUES.match(template["query"])
        assert match, f"`{template['name']}` must be label_values(metric, label)"
        found.append(Variable(template["name"], match[1], match[2]))
    return found


def queries(name: str) -> list[PanelQuery]:
    dashboard = load(name)
    return [
        PanelQuery(name, panel["title"], target["expr"])
        for panel in dashboard["panels"]  # type: ignore[attr-defined]
        if panel.get("type") != "row"
        for target in panel["targets"]
    ]


def alert_exprs() -> dict[str, str]:
    rules = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())
    return {
        rule["alert"]: rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def substitute_macros(expr: str, rate_interval: str, interval: str) -> str:
    """Grafana's interval macros, as Grafana would fill them in."""
    return expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval)
