"""``policies/<name>/training_summary.json``: a policy's training inputs, for drift checks.

The manifest's ``training_data`` block (means, 5/50/95% quantiles) says what
a model saw in words and a few numbers; drift needs more: per contract
feature the PSI bin edges and reference proportions, a 201-point quantile
grid with its CDF (KS), min/max (support), the hardware classes and workload
kinds seen, and the calibrated per-window flag rules (`service.checks.drift`),
each with its arrival check: the training median of the window's arrival
statistic and its two-sided threshold (null for a policy trained on synthetic
requests, whose times are indices, not an arrival process). The arrival check
of a simulator-trained policy is calibrated on ``ARRIVAL_EPISODES`` episodes of
its training scenario and seed that follow the ones it was trained on: the
same conditions, but enough episodes to hold the rare retry storms that
dominate a window's arrival statistic (docs/drift.md).

Format (``schema: understudy-training-summary/v2``; v2 added the arrival
fields, so a v1 file is refused and must be regenerated)::

    {"schema", "policy", "source", "feature_version", "feature_hash",
     "feature_names": [...], "n_rows", "n_requests", "n_groups",
     "hardware_classes": [...], "workload_kinds": [...], "qos_classes": [...],
     "features": {name: {"min", "max", "psi_edges", "psi_proportions",
                         "ks_grid", "ks_cdf"}},
     "flag_rules": [{"window_requests", "alpha", "threshold",
                     "calibration_windows", "scale": {name: s},
                     "arrival_center", "arrival_threshold"}],
     "generator": {"command", "seed", ...},
     "outcome": {...}}            # optional: service.policies.outcome_summary

A policy trained on simulated episodes also gets the ``outcome`` block: per
cell (model family x hardware class x accelerators) the training median log
throughput of placed jobs, and outcome rules calibrated on the
arrival-calibration episodes (`service.checks.outcome_drift`): the check that
sees hardware running slower than in training, which no request shows.

Drift compares what the scorer computes once per batch — the *contract*
feature rows of every option of every request — so the summary is over the
contract features of every option of every training request, also for a
policy whose model reads other features (``lcb-planner`` reads the outcome
features of the same requests) or was fitted on the chosen option only
(``iwr-scorer``): its inputs at serving time are all options.

``python -m service.learning.training_summaries`` (`COMMAND`) recomputes
every summary from the data each policy was trained on, with the seeds in its
manifest's ``build`` block, and writes them with sorted keys, so a rerun
writes the same bytes. Rerun it whenever the feature hash changes: a summary
for another feature definition is refused at load (`load_summary`).
Baselines have no training data and no summary. This module computes a
summary from given inputs (`summarise`); where the inputs come from — the
simulator's episodes, the synthetic requests — is that build entry point's
business, so that the policies never import the environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.checks.drift import (
    DEFAULT_ALPHA,
    Categories,
    FeatureReference,
    FlagRule,
    build_reference,
    calibrate,
    calibrate_arrival,
    request_categories,
)
from service.contract import DEFAULT_FEATURES, FeatureFunction, MirrorRequest
from service.policies.errors import PolicyLoadError
from service.policies.outcome_summary import (
    Episode,
    OutcomeSummary,
    outcome_from_dict,
    summarise_outcomes,
)

SCHEMA = "understudy-training-summary/v2"
SUMMARY_FILE = "training_summary.json"
COMMAND = "python -m service.learning.training_summaries"
"""What regenerates every summary (`service.learning.training_summaries`)."""
WINDOW_SIZES = (250, 500, 1000, 2000, 4000, 8000)
"""Window sizes (requests) a flag rule is calibrated for."""
CALIBRATION_WINDOWS = 1000


@dataclass(frozen=True, eq=False)
class TrainingReference:
    """A loaded summary: the reference and its flag rules, with provenance."""

    policy: str
    source: str
    feature_version: str
    feature_hash: str
    n_requests: int
    n_groups: int
    reference: FeatureReference
    rules: tuple[FlagRule, ...]
    generator: Mapping[str, Any]
    outcome: OutcomeSummary | None = None
    """Outcome drift (`service.policies.outcome_summary`); None without simulated outcomes."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the module docstring's format)."""
        out = self._feature_dict()
        if self.outcome is not None:
            out["outcome"] = self.outcome.to_dict()
        return out

    def _feature_dict(self) -> dict[str, Any]:
        r = self.reference
        return {
            "schema": SCHEMA,
            "policy": self.policy,
            "source": self.source,
            "feature_version": self.feature_version,
            "feature_hash": self.feature_hash,
            "feature_names": list(r.names),
            "n_rows": r.n_rows,
            "n_requests": self.n_requests,
            "n_groups": self.n_groups,
            "hardware_classes": sorted(r.hardware_classes),
            "workload_kinds": sorted(r.workload_kinds),
            **({} if r.qos_classes is None else {"qos_classes": sorted(r.qos_classes)}),
            "features": {
                name: {
                    "min": float(r.low[f]),
                    "max": float(r.high[f]),
                    "psi_edges": r.edges[f].tolist(),
                    "psi_proportions": r.proportions[f].tolist(),
                    "ks_grid": r.grid[f].tolist(),
                    "ks_cdf": r.grid_cdf[f].tolist(),
                }
                for f, name in enumerate(r.names)
            },
            "flag_rules": [
                {
                    "window_requests": rule.window_requests,
                    "alpha": rule.alpha,
                    "threshold": rule.threshold,
                    "calibration_windows": rule.calibration_windows,
                    "scale": dict(zip(r.names, rule.scale.tolist(), strict=True)),
                    "arrival_center": rule.arrival_center,
                    "arrival_threshold": rule.arrival_threshold,
                }
                for rule in self.rules
            ],
            "generator": dict(self.generator),
        }


def _from_dict(policy: str, data: Mapping[str, Any]) -> TrainingReference:
    names = tuple(data["feature_names"])
    feats = data["features"]
    arr = {k: tuple(np.asarray(feats[n][k], dtype=np.float64) for n in names) for k in (
        "psi_edges", "psi_proportions", "ks_grid", "ks_cdf")}  # fmt: skip
    reference = FeatureReference(
        names=names,
        n_rows=int(data["n_rows"]),
        edges=arr["psi_edges"],
        proportions=arr["psi_proportions"],
        grid=arr["ks_grid"],
        grid_cdf=arr["ks_cdf"],
        low=np.array([feats[n]["min"] for n in names], dtype=np.float64),
        high=np.array([feats[n]["max"] for n in names], dtype=np.float64),
        hardware_classes=frozenset(data["hardware_classes"]),
        workload_kinds=frozenset(data["workload_kinds"]),
        qos_classes=None if data.get("qos_classes") is None else frozenset(data["qos_classes"]),
    )
    rules = tuple(
        FlagRule(
            window_requests=int(r["window_requests"]),
            alpha=float(r["alpha"]),
            scale=np.array([r["scale"][n] for n in names], dtype=np.float64),
            threshold=float(r["threshold"]),
            calibration_windows=int(r["calibration_windows"]),
            arrival_center=_optional_float(r["arrival_center"]),
            arrival_threshold=_optional_float(r["arrival_threshold"]),
        )
        for r in data["flag_rules"]
    )
    return TrainingReference(
        policy=policy,
        source=str(data["source"]),
        feature_version=str(data["feature_version"]),
        feature_hash=str(data["feature_hash"]),
        n_requests=int(data["n_requests"]),
        n_groups=int(data["n_groups"]),
        reference=reference,
        rules=rules,
        generator=dict(data.get("generator", {})),
        outcome=outcome_from_dict(data.get("outcome")),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def load_summary(
    directory: Path, features: FeatureFunction = DEFAULT_FEATURES
) -> TrainingReference | None:
    """The summary in a policy's folder, None when it has none.

    Raises:
        PolicyLoadError: unreadable, another schema, or computed for another
            feature definition than `features` (rerun the generator).
    """
    policy = directory.name
    path = directory / SUMMARY_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PolicyLoadError(policy, f"cannot read {SUMMARY_FILE}: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise PolicyLoadError(policy, f"`{SUMMARY_FILE}` `schema` must be {SCHEMA!r}, got {got!r}")
    if data.get("feature_hash") != features.definition_hash:
        raise PolicyLoadError(
            policy,
            f"`{SUMMARY_FILE}` `feature_hash` {str(data.get('feature_hash'))[:12]} differs from the"
            f" running feature function `{features.version}` {features.definition_hash[:12]};"
            f" regenerate it with `{COMMAND}`",
        )
    if tuple(data.get("feature_names", ())) != tuple(features.names):
        raise PolicyLoadError(policy, f"`{SUMMARY_FILE}` `feature_names` differ from the running")
    try:
        return _from_dict(policy, data)
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyLoadError(policy, f"`{SUMMARY_FILE}` is malformed: {exc!r}") from exc


# --- computing a summary from its inputs (the build: service.learning.training_summaries) ---


@dataclass(frozen=True, eq=False)
class TrainingInputs:
    """The requests a policy was trained on, featurised, in time order.

    Attributes:
        x: float32 ``(n_rows, F)`` contract features of every option.
        offsets: int64 ``(n_requests + 1,)``.
        group_starts: int64 ``(n_groups + 1,)``, first request of each episode
            (or of each synthetic cluster).
        categories: per request, `request_categories`.
        arrival_times: float64, the ``request_time`` of every request of the
            arrival-calibration episodes, concatenated; None when the source has no
            arrival process (synthetic requests, whose times are indices): no check.
        arrival_starts: int64, first request of each arrival-calibration episode.
    """

    source: str
    x: NDArray[np.float32]
    offsets: NDArray[np.int64]
    group_starts: NDArray[np.int64]
    categories: list[Categories]
    generator: dict[str, Any]
    arrival_times: NDArray[np.float64] | None = None
    arrival_starts: NDArray[np.int64] | None = None
    trained_episodes: Sequence[Episode] | None = None
    held_out_episodes: Sequence[Episode] | None = None
    """Simulated sources: the trained-on and the arrival-calibration episodes with their
    outcomes (the outcome check); None for synthetic requests."""


def featurise(groups: Sequence[Sequence[MirrorRequest]]) -> tuple[
    NDArray[np.float32], NDArray[np.int64], NDArray[np.int64], list[Categories]
]:  # fmt: skip
    """Rows, request offsets, group starts and categories of `groups` of requests."""
    from service.policies.batching import make_batch

    xs, counts, sizes, cats = [], [], [], []
    for requests in groups:
        batch = make_batch(list(requests))
        xs.append(batch.features)
        counts.append(np.diff(batch.offsets))
        sizes.append(len(requests))
        cats += [request_categories(r) for r in requests]
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return np.concatenate(xs), offsets, starts, cats


def request_times(groups: Sequence[Sequence[MirrorRequest]]) -> NDArray[np.float64]:
    """Every request's ``request_time``, groups concatenated (each episode restarts its clock)."""
    return np.array([r.request_time for g in groups for r in g], dtype=np.float64)


def summarise(
    policy: str,
    inputs: TrainingInputs,
    features: FeatureFunction = DEFAULT_FEATURES,
    *,
    window_sizes: Sequence[int] = WINDOW_SIZES,
    alpha: float = DEFAULT_ALPHA,
    n_windows: int = CALIBRATION_WINDOWS,
    seed: int = 0,
) -> TrainingReference:
    """Reference + flag rules calibrated for every window size (seeded)."""
    hardware = set().union(*(c[0] for c in inputs.categories))
    kinds = {c[1] for c in inputs.categories}
    qos = {c[2] for c in inputs.categories}
    reference = build_reference(inputs.x, features.names, hardware, kinds, qos_classes=qos)
    feature_rules = tuple(
        calibrate(
            reference,
            inputs.x,
            inputs.offsets,
            inputs.group_starts,
            size,
            alpha=alpha,
            n_windows=n_windows,
            seed=seed + i,
        )
        for i, size in enumerate(window_sizes)
    )
    rules = feature_rules
    if inputs.arrival_times is not None and inputs.arrival_starts is not None:
        rules = tuple(
            calibrate_arrival(
                rule,
                inputs.arrival_times,
                inputs.arrival_starts,
                n_windows=n_windows,
                seed=seed + i,
            )
            for i, rule in enumerate(feature_rules)
        )
    outcome = None
    if inputs.trained_episodes is not None and inputs.held_out_episodes is not None:
        outcome = summarise_outcomes(
            inputs.trained_episodes,
            inputs.held_out_episodes,
            f"outcomes of the {len(inputs.trained_episodes)} episodes trained on (reference);"
            f" rules calibrated on the {len(inputs.held_out_episodes)} arrival-calibration"
            " episodes",
            n_windows=n_windows,
            seed=seed,
        )
    return TrainingReference(
        policy=policy,
        source=inputs.source,
        feature_version=features.version,
        feature_hash=features.definition_hash,
        n_requests=len(inputs.offsets) - 1,
        n_groups=len(inputs.group_starts) - 1,
        reference=reference,
        rules=rules,
        generator={
            "command": COMMAND,
            "calibration_seed": seed,
            "numpy": np.__version__,
            **inputs.generator,
        },
        outcome=outcome,
    )


def write_summary(summary: TrainingReference, directory: Path) -> Path:
    """Write `summary` as sorted, indented JSON; returns the path."""
    path = directory / SUMMARY_FILE
    path.write_text(json.dumps(summary.to_dict(), sort_keys=True, indent=1) + "\n")
    return path
