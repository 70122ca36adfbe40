"""``python -m service.learning.training_summaries``: every policy's ``training_summary.json``.

The build entry point of the drift references (format and loader in
`service.policies.training_summary`, which computes a summary from its inputs
with `summarise`). Here is where the inputs come from, read from each
manifest's ``build`` block: for a policy `understudy train` fitted on
simulated episodes, those episodes again (`service.environment.simulated_episodes`),
and ``ARRIVAL_EPISODES`` more of the same scenario and seed for the arrival and
outcome checks; for a policy fitted on synthetic requests, the same synthetic
batch. It sits with the training code, not in ``policies``, because it runs the
simulator and the policies must not import the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from service.environment import simulated_episodes
from service.policies.training_summary import (
    COMMAND,
    TrainingInputs,
    featurise,
    request_times,
    summarise,
    write_summary,
)

ARRIVAL_EPISODES = 1000
"""Training-condition episodes the arrival check is calibrated on (simulated sources)."""


def sources(policies_dir: Path) -> dict[str, TrainingInputs]:
    """Per ONNX policy, its training requests (read from each manifest's ``build`` block)."""
    import yaml

    out: dict[str, TrainingInputs] = {}
    cache: dict[str, TrainingInputs] = {}  # policies trained on the same logs share them
    for path in sorted(policies_dir.glob("*/policy.yaml")):
        m = yaml.safe_load(path.read_text())
        if m.get("kind") != "policy":
            continue
        build = m.get("build") or {}
        name = m["name"]
        st = build.get("settings") or {}
        if "episodes" not in st:
            continue  # not fitted on simulated episodes: no inputs to rebuild its summary from
        seed, n_ep = int(st["seed"]), int(st["episodes"])
        jobs = st.get("jobs_per_episode")
        source = (
            f"every request (forced defers included) of simulated scenario `train`,"
            f" seed {seed},"
            f" episodes 0-{n_ep - 1} — the episodes it was fitted on"
        )
        gen = {"data": "simulated", "scenario": "train", "seed": seed, "episodes": n_ep}
        if jobs is not None:
            gen["jobs_per_episode"] = jobs

        def groups_of(seed: int = seed, n_ep: int = n_ep, jobs: Any = jobs) -> Any:
            return simulated_episodes("train", seed, range(n_ep), jobs)

        def arrival_of(seed: int = seed, n_ep: int = n_ep, jobs: Any = jobs) -> Any:
            episodes = range(n_ep, n_ep + ARRIVAL_EPISODES)  # never trained on
            return simulated_episodes("train", seed, episodes, jobs)

        gen["arrival_episodes"] = f"{n_ep}-{n_ep + ARRIVAL_EPISODES - 1}"
        key = json.dumps(gen, sort_keys=True)
        if key not in cache:
            trained = groups_of()
            x, offsets, starts, cats = featurise([g for g, _ in trained])
            held_out = arrival_of()
            a_groups = [g for g, _ in held_out]
            times = request_times(a_groups)
            sizes = [len(g) for g in a_groups]
            a_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            cache[key] = TrainingInputs(
                source,
                x,
                offsets,
                starts,
                cats,
                gen,
                times,
                a_starts,
                trained_episodes=trained,
                held_out_episodes=held_out,
            )
        out[name] = cache[key]
    return out


def main(argv: list[str] | None = None) -> int:
    """Regenerate every ONNX policy's summary under ``--policies``."""
    from rich.console import Console

    parser = argparse.ArgumentParser(prog=COMMAND.removeprefix("python "))
    parser.add_argument("--policies", type=Path, default=Path("policies"), help="policies folder")
    parser.add_argument("--seed", type=int, default=0, help="calibration seed")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if not args.policies.is_dir():
        console.print(f"[red]`--policies` {args.policies} is not a folder[/red]")
        return 2
    for name, inputs in sources(args.policies).items():
        summary = summarise(name, inputs, seed=args.seed)
        path = write_summary(summary, args.policies / name)
        thresholds = ", ".join(
            f"{r.window_requests}: {r.threshold:.2f}"
            + ("" if r.arrival_threshold is None else f" / arrival ±{r.arrival_threshold:.2f}")
            for r in summary.rules
        )
        console.print(
            f"{path}: {summary.reference.n_rows} rows, {summary.n_requests} requests,"
            f" {summary.n_groups} groups; thresholds {{{thresholds}}}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
