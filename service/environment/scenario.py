"""Scenarios: a training condition and held-out conditions, one YAML file each.

The files live in ``service/environment/scenarios/*.yaml`` (package data, so
they travel with the code that reads them). Each names its data (trace,
machine shapes), the cluster, the production emulator, reward and cost, and
says in ``held_out`` what differs from training. A `Scenario` is pure
configuration; `service.environment.world.World` binds it to the data.

Schema (all keys required unless marked optional)::

    name, summary, held_out: str
    trace: {vc: str, jobs_per_episode: int, arrival_time_scale: float,
            surge: bool (optional, default false)}
    cluster: [{hardware: K80|P100|V100, count: int, machine: Alibaba gpu_type}]
    packing: bool                 # single-GPU jobs may share a GPU (Gavel pairs)
    degrade: {class: factor}      # optional; throughput multiplier in (0, 1]
    background_fraction: float    # optional; GPUs busy with long jobs at t=0
    draining: [node index]        # optional; nodes cordoned from t=0
    slo_factor: float             # SLO = factor x fastest measured run time
    noise_sigma: float | null     # optional; null = from the data
    production: {mode: softmax|epsilon_greedy|deterministic,
                 temperature, epsilon, share_penalty, spread_penalty}
    reward: {outcome field: weight}
    cost: {signals: {signal: weight}, failures: {kind: weight}}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from service.contract import KNOWN_HARDWARE, CostSpec, InvalidInput, RewardSpec
from service.environment.data import GAVEL_WORKER_TYPES


class EmulatorMode(StrEnum):
    """How the production emulator turns packing scores into an action."""

    SOFTMAX = "softmax"
    EPSILON_GREEDY = "epsilon_greedy"
    DETERMINISTIC = "deterministic"


@dataclass(frozen=True, slots=True)
class ProductionConfig:
    """The logging policy's knobs (see `service.environment.emulator`)."""

    mode: EmulatorMode = EmulatorMode.SOFTMAX
    temperature: float = 0.1
    epsilon: float = 0.1
    share_penalty: float = 1.0
    spread_penalty: float = 0.5


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """`count` servers of class `hardware`, shaped like Alibaba machine type `machine`."""

    hardware: str
    count: int
    machine: str


@dataclass(frozen=True)
class Scenario:
    """One condition of the simulator: data, cluster, dynamics, logging policy, reward."""

    name: str
    summary: str
    held_out: str
    trace_vc: str
    jobs_per_episode: int
    arrival_time_scale: float
    nodes: tuple[NodeGroup, ...]
    slo_factor: float
    production: ProductionConfig
    reward: RewardSpec
    cost: CostSpec
    surge: bool = False
    packing: bool = True
    degrade: Mapping[str, float] = field(default_factory=dict)
    background_fraction: float = 0.0
    draining: tuple[int, ...] = ()
    noise_sigma: float | None = None

    @property
    def n_nodes(self) -> int:
        """Servers in the cluster."""
        return sum(g.count for g in self.nodes)

    def replace(self, **changes: Any) -> Scenario:
        """A copy with `changes` applied and validated (e.g. fewer jobs for a test)."""
        out = dataclasses.replace(self, **changes)
        out.validate()
        return out

    def validate(self) -> None:
        """Raise `InvalidInput` naming the first bad field."""
        if self.jobs_per_episode < 1:
            raise InvalidInput(
                "trace.jobs_per_episode", f"must be >= 1, got {self.jobs_per_episode}"
            )
        _positive("trace.arrival_time_scale", self.arrival_time_scale)
        _positive("slo_factor", self.slo_factor)
        if not self.nodes:
            raise InvalidInput("cluster", "must list at least one node group")
        for i, g in enumerate(self.nodes):
            if g.hardware not in GAVEL_WORKER_TYPES or g.hardware not in KNOWN_HARDWARE:
                raise InvalidInput(
                    f"cluster[{i}].hardware",
                    f"must be a measured class ({', '.join(GAVEL_WORKER_TYPES)}), "
                    f"got {g.hardware!r}",
                )
            if g.count < 1:
                raise InvalidInput(f"cluster[{i}].count", f"must be >= 1, got {g.count}")
        for cls, factor in self.degrade.items():
            if cls not in {g.hardware for g in self.nodes}:
                raise InvalidInput(f"degrade.{cls}", "is not a class of this cluster")
            if not (math.isfinite(factor) and 0 < factor <= 1):
                raise InvalidInput(f"degrade.{cls}", f"must be in (0, 1], got {factor}")
        if not 0 <= self.background_fraction < 1:
            raise InvalidInput(
                "background_fraction", f"must be in [0, 1), got {self.background_fraction}"
            )
        for i, node in enumerate(self.draining):
            if not 0 <= node < self.n_nodes:
                raise InvalidInput(
                    f"draining[{i}]", f"must index a node (< {self.n_nodes}), got {node}"
                )
        if self.noise_sigma is not None and not (
            math.isfinite(self.noise_sigma) and self.noise_sigma >= 0
        ):
            raise InvalidInput("noise_sigma", f"must be >= 0 or null, got {self.noise_sigma}")
        p = self.production
        _positive("production.temperature", p.temperature)
        if not 0 <= p.epsilon <= 1:
            raise InvalidInput("production.epsilon", f"must be in [0, 1], got {p.epsilon}")
        for knob in ("share_penalty", "spread_penalty"):
            value = getattr(p, knob)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidInput(f"production.{knob}", f"must be >= 0, got {value}")


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InvalidInput(name, f"must be finite and > 0, got {value}")


def _require(doc: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise InvalidInput(f"{where}{key}", "is required")
    return doc[key]


def scenario_from_dict(doc: Mapping[str, Any]) -> Scenario:
    """Build and validate a `Scenario` from a parsed YAML document."""
    known = {
        "name", "summary", "held_out", "trace", "cluster", "packing", "degrade",
        "background_fraction", "draining", "slo_factor", "noise_sigma", "production",
        "reward", "cost",
    }  # fmt: skip
    for key in doc:
        if key not in known:
            raise InvalidInput(str(key), f"is not a scenario key ({', '.join(sorted(known))})")
    trace = _require(doc, "trace", "")
    production = dict(doc.get("production") or {})
    cost = doc.get("cost") or {}
    try:
        prod = ProductionConfig(
            mode=EmulatorMode(production.pop("mode", EmulatorMode.SOFTMAX.value)),
            **{k: float(v) for k, v in production.items()},
        )
    except (TypeError, ValueError) as exc:
        raise InvalidInput("production", f"is not a valid emulator config: {exc}") from exc
    scenario = Scenario(
        name=str(_require(doc, "name", "")),
        summary=str(_require(doc, "summary", "")),
        held_out=str(_require(doc, "held_out", "")),
        trace_vc=str(_require(trace, "vc", "trace.")),
        jobs_per_episode=int(_require(trace, "jobs_per_episode", "trace.")),
        arrival_time_scale=float(_require(trace, "arrival_time_scale", "trace.")),
        surge=bool(trace.get("surge", False)),
        nodes=tuple(
            NodeGroup(str(g["hardware"]), int(g["count"]), str(g["machine"]))
            for g in _require(doc, "cluster", "")
        ),
        packing=bool(doc.get("packing", True)),
        degrade=MappingProxyType({str(k): float(v) for k, v in (doc.get("degrade") or {}).items()}),
        background_fraction=float(doc.get("background_fraction", 0.0)),
        draining=tuple(int(i) for i in doc.get("draining") or ()),
        slo_factor=float(_require(doc, "slo_factor", "")),
        noise_sigma=None if doc.get("noise_sigma") is None else float(doc["noise_sigma"]),
        production=prod,
        reward=RewardSpec(dict(_require(doc, "reward", ""))),
        cost=CostSpec(dict(cost.get("signals") or {}), dict(cost.get("failures") or {})),
    )
    scenario.validate()
    return scenario


def _scenario_dir() -> Path:
    return Path(str(resources.files("service.environment") / "scenarios"))


def scenario_names() -> tuple[str, ...]:
    """Names of the shipped scenarios, training first."""
    names = sorted(p.stem for p in _scenario_dir().glob("*.yaml"))
    return tuple(sorted(names, key=lambda n: (n != "train", n)))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (``"train"``), or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = _scenario_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise InvalidInput(
            "scenario",
            f"must be one of {', '.join(scenario_names())} or a YAML path, got {name_or_path!r}",
        )
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise InvalidInput("scenario", f"`{path}` must hold a YAML mapping")
    return scenario_from_dict(doc)
