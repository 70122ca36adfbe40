"""The ``outcome`` block of a training summary: per-cell throughput medians and outcome rules.

Kept beside ``training_summary.json``'s feature reference for a policy trained
on simulated episodes (`service.checks.outcome_drift` says what is compared and
why). Format (optional key ``outcome`` of ``understudy-training-summary/v2``;
absent for a policy trained on synthetic requests, which have no outcomes)::

    "outcome": {
      "cells": {"<family>|<hardware>|<accelerators>": {"median", "n"}},
      "rules": [{"window_outcomes", "alpha", "threshold", "calibration_windows",
                 "scale": {hardware: s}}],
      "source": "..."}

The reference is built on the outcomes of the episodes the policy was trained
on; the rules are calibrated on the outcomes of the arrival-calibration
episodes (the same scenario and seed, never trained on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.checks.outcome_drift import (
    OUTCOME_ALPHA,
    OUTCOME_WINDOW_SIZES,
    OutcomeReference,
    OutcomeRows,
    OutcomeRule,
    build_outcome_reference,
    calibrate_outcome,
    outcome_rows,
)
from service.contract import MirrorRequest, Outcome

Episode = tuple[list[MirrorRequest], dict[str, Outcome]]
"""One simulated episode: every mirrored request, and the outcomes by request id.

Built by `service.environment.simulated_episodes` and passed in by the build code
(`service.learning.training_summaries`): the policies never import the environment."""


@dataclass(frozen=True, eq=False)
class OutcomeSummary:
    """A policy's outcome reference and its calibrated rules."""

    reference: OutcomeReference
    rules: tuple[OutcomeRule, ...]
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the module docstring's format)."""
        ref = self.reference
        return {
            "cells": {c: {"median": ref.median[c], "n": ref.count[c]} for c in sorted(ref.median)},
            "rules": [
                {
                    "window_outcomes": r.window_outcomes,
                    "alpha": r.alpha,
                    "threshold": r.threshold,
                    "calibration_windows": r.calibration_windows,
                    "scale": dict(zip(r.classes, r.scale.tolist(), strict=True)),
                }
                for r in self.rules
            ],
            "source": self.source,
        }


def outcome_from_dict(data: Mapping[str, Any] | None) -> OutcomeSummary | None:
    """The block read back; None when the summary has none."""
    if data is None:
        return None
    cells = data["cells"]
    reference = OutcomeReference(
        median={c: float(v["median"]) for c, v in cells.items()},
        count={c: int(v["n"]) for c, v in cells.items()},
    )
    rules = tuple(
        OutcomeRule(
            window_outcomes=int(r["window_outcomes"]),
            alpha=float(r["alpha"]),
            classes=tuple(sorted(r["scale"])),
            scale=np.array([r["scale"][h] for h in sorted(r["scale"])], dtype=np.float64),
            threshold=float(r["threshold"]),
            calibration_windows=int(r["calibration_windows"]),
        )
        for r in data["rules"]
    )
    return OutcomeSummary(reference, rules, str(data["source"]))


def episode_rows(episodes: Sequence[Episode]) -> tuple[OutcomeRows, NDArray[np.int64]]:
    """Outcome rows of `episodes` concatenated (request indices into the concatenated
    requests), and each episode's first row."""
    parts: list[OutcomeRows] = []
    starts = [0]
    base = 0
    for requests, outcomes in episodes:
        rows = outcome_rows(requests, outcomes)
        parts.append(
            OutcomeRows(rows.request_index + base, rows.hardware, rows.cell, rows.log_throughput)
        )
        starts.append(starts[-1] + len(rows))
        base += len(requests)
    fields = ("request_index", "hardware", "cell", "log_throughput")
    joined = OutcomeRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))
    return joined, np.array(starts, dtype=np.int64)


def summarise_outcomes(
    trained: Sequence[Episode],
    held_out: Sequence[Episode],
    source: str,
    *,
    window_sizes: Sequence[int] = OUTCOME_WINDOW_SIZES,
    alpha: float = OUTCOME_ALPHA,
    n_windows: int = 1000,
    seed: int = 0,
) -> OutcomeSummary:
    """Reference on `trained` episodes, rules calibrated on `held_out` ones (seeded)."""
    reference = build_outcome_reference(episode_rows(trained)[0])
    rows, starts = episode_rows(held_out)
    rules = tuple(
        calibrate_outcome(
            reference, rows, starts, size, alpha=alpha, n_windows=n_windows, seed=seed + i
        )
        for i, size in enumerate(window_sizes)
    )
    return OutcomeSummary(reference, rules, source)
