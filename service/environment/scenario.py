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
    cluster: [{hardware: K80|P100|V100, count: int, machine: Alibaba gpu_type,
               partition: MIG profile (optional; see world.MIG_PROFILES)}]
    packing: bool                 # share jobs may co-locate on one GPU (Gavel pairs)
    sharing: {fraction: float, share: [lo, hi], infer_fraction: float, memory: bool,
              kind: str}
                                  # optional; single-GPU jobs drawn as share jobs
                                  # (default: none, every job asks for whole GPUs)
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
    """`count` servers of class `hardware`, shaped like Alibaba machine type `machine`.

    With `partition` (a MIG profile name, ``service.environment.world.MIG_PROFILES``)
    each GPU is cut into that profile's slices, each a device of its own class
    (``f"{hardware}-{partition}"``). Such a class was never measured by Gavel,
    so no simulated job is allowed on it (the contract masks it; a whole known
    class Gavel did not measure is rated by
    `service.environment.partitions.scale_from_v100` instead); it is there so
    that requests carry a partitioned node, as real fleets do.
    """

    hardware: str
    count: int
    machine: str
    partition: str = ""


SHARE_RANGE_LIMITS = (1.0 / 3.0, 0.5)
"""Share jobs ask for a share in ``(1/3, 1/2]``: any two fit on one device, three never do.

Gavel measured pairs only, so a device may hold at most two jobs; with shares
in this range that limit is what the shares themselves say (no hidden cap).
"""


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """Which jobs ask for a share of one GPU instead of whole GPUs (the sharing rule).

    Each single-GPU trace job of an episode is a *share job* with probability
    `fraction`: an inference server (kind ``infer``, probability
    `infer_fraction`) or a small fine-tune (``finetune``), asking for a share
    drawn uniformly from `share` (rounded to 0.01) and the device memory of
    its model family (`service.environment.samples.family_memory_gb`, an
    assumption: the trace has none; ``memory: false`` asks for none).
    With `kind` set (e.g. ``train``) every share job has that kind instead.
    ``fraction = 1`` without memory is exactly the simulator's former
    packing of single-GPU jobs (same options, placements and rates): the
    shipped scenarios but `shared` say so, keeping their dynamics.
    Multi-GPU jobs never share (Gavel measured no multi-GPU pair).
    ``fraction = 0`` (the default): no share jobs, every request asks for
    whole GPUs, and no extra random draw is made.
    """

    fraction: float = 0.0
    share: tuple[float, float] = (0.35, 0.5)
    infer_fraction: float = 0.75
    memory: bool = True
    kind: str = ""


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
    sharing: SharingConfig = field(default_factory=SharingConfig)
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
            if g.partition:
                continue  # a partitioned group: checked by _validate_partitions
            if g.hardware not in KNOWN_HARDWARE:  # Gavel's or rated by world's rule
                raise InvalidInput(
                    f"cluster[{i}].hardware",
                    f"must be a known class (Gavel's {', '.join(GAVEL_WORKER_TYPES)} or "
                    f"another of KNOWN_HARDWARE), got {g.hardware!r}",
                )
            if g.count < 1:
                raise InvalidInput(f"cluster[{i}].count", f"must be >= 1, got {g.count}")
        _validate_partitions(self.nodes)
        _validate_sharing(self.sharing)
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


def _validate_partitions(nodes: tuple[NodeGroup, ...]) -> None:
    """A partitioned group names a known class and a MIG profile of it."""
    from service.environment.partitions import MIG_PROFILES  # data-free table, no cycle

    for i, g in enumerate(nodes):
        if not g.partition:
            continue
        if g.hardware not in KNOWN_HARDWARE:
            raise InvalidInput(f"cluster[{i}].hardware", f"is not a known class: {g.hardware!r}")
        if (g.hardware, g.partition) not in MIG_PROFILES:
            known = ", ".join(f"{h} {p}" for h, p in MIG_PROFILES)
            raise InvalidInput(
                f"cluster[{i}].partition", f"must be one of ({known}), got {g.partition!r}"
            )


def _validate_sharing(sharing: SharingConfig) -> None:
    if not 0 <= sharing.fraction <= 1:
        raise InvalidInput("sharing.fraction", f"must be in [0, 1], got {sharing.fraction}")
    if not 0 <= sharing.infer_fraction <= 1:
        raise InvalidInput(
            "sharing.infer_fraction", f"must be in [0, 1], got {sharing.infer_fraction}"
        )
    lo, hi = sharing.share
    if not (SHARE_RANGE_LIMITS[0] < lo <= hi <= SHARE_RANGE_LIMITS[1]):
        raise InvalidInput("sharing.share", f"must satisfy 1/3 < lo <= hi <= 1/2, got [{lo}, {hi}]")


def _sharing_from(doc: Any) -> SharingConfig:
    if doc is None:
        return SharingConfig()
    if not isinstance(doc, Mapping):
        raise InvalidInput("sharing", "must be a mapping")
    unknown = set(doc) - {"fraction", "share", "infer_fraction", "memory", "kind"}
    if unknown:
        raise InvalidInput(f"sharing.{sorted(unknown)[0]}", "is not a sharing key")
    share = doc.get("share", SharingConfig().share)
    try:
        lo, hi = (float(x) for x in share)
        return SharingConfig(
            fraction=float(doc.get("fraction", 0.0)),
            share=(lo, hi),
            infer_fraction=float(doc.get("infer_fraction", SharingConfig().infer_fraction)),
            memory=bool(doc.get("memory", True)),
            kind=str(doc.get("kind", "")),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidInput("sharing", f"is not a valid sharing config: {exc}") from exc


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
        "name", "summary", "held_out", "trace", "cluster", "packing", "sharing", "degrade",
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
            NodeGroup(
                str(g["hardware"]), int(g["count"]), str(g["machine"]), str(g.get("partition", ""))
            )
            for g in _require(doc, "cluster", "")
        ),
        packing=bool(doc.get("packing", True)),
        sharing=_sharing_from(doc.get("sharing")),
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
