"""``understudy train | compare | sweep``: learn from simulated logs, compare, sweep shifts.

    understudy train                     # policies/{learned-outcome,lcb-planner,iwr-scorer}
    understudy compare --seeds 5         # out/compare: results, timings, run_manifest (.json)
    understudy compare --from-manifest out/compare/run_manifest.json --out out/compare-rerun
    understudy sweep --seeds 5           # out/sweep: sweep.json, .csv, .png, run_manifest.json

Every command is seeded. ``train`` needs scikit-learn and skl2onnx (build
time); ``compare`` and ``sweep`` load the committed ONNX artifacts only.
Registered on the main app with ``app.add_typer(learning_app)``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.learning import run_manifest
from service.learning.stats import dumps

learning_app = typer.Typer(help="Policy learning, comparison and shift sweeps.")
console = Console(highlight=False)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def _csv(
    text: str | None, cast: type = str, option: str = "", allowed: Any = None
) -> tuple[Any, ...] | None:
    """A comma-separated option as a tuple; a bad item is `typer.BadParameter` naming `option`."""
    if not text:
        return None
    items = [x.strip() for x in text.split(",") if x.strip()]
    if allowed is not None and (unknown := [x for x in items if x not in allowed]):
        raise typer.BadParameter(
            f"must be among {', '.join(allowed)}, got {', '.join(unknown)}", param_hint=option
        )
    try:
        return tuple(cast(x) for x in items)
    except ValueError as exc:
        message = f"expected {cast.__name__}s, got {text!r}"
        raise typer.BadParameter(message, param_hint=option) from exc


@learning_app.command()
def train(
    out: Annotated[Path, typer.Option(help="Policies folder to write.")] = REPO_ROOT / "policies",
    seed: Annotated[int, typer.Option(help="Seed of every random choice.")] = 0,
    episodes: Annotated[
        int, typer.Option(min=1, help="Training-scenario episodes to fit on.")
    ] = 120,
    pessimism: Annotated[float, typer.Option(help="Planner's pessimism (0 = median).")] = 1.0,
    packing_weight: Annotated[float, typer.Option(help="Planner's tight-fit preference.")] = 0.05,
    jobs_per_episode: Annotated[
        int | None, typer.Option(min=1, help="Override (quick runs).")
    ] = None,
) -> None:
    """Fit the outcome predictor, the LCB planner and the IWR scorer; export ONNX + manifests."""
    from service.learning.train import TrainSettings
    from service.learning.train import train as run

    settings = TrainSettings(
        seed=seed,
        episodes=episodes,
        pessimism=pessimism,
        packing_weight=packing_weight,
        jobs_per_episode=jobs_per_episode,
    )
    with _progress() as progress:
        figures = run(out, settings, progress)
    p = figures["predictor"]["held_out"]["log_throughput"]
    table = Table("figure", "value", title=f"trained into {out}")
    rows = [
        ("pinball ratio vs group quantiles (gate <= 0.9)", p["pinball_ratio_vs_group_quantiles"]),
        ("pinball ratio vs group mean", p["pinball_ratio_vs_group_mean"]),
        ("80% interval coverage, held-out train", p["interval_coverage"]),
        (
            "coverage on options production did not choose",
            figures["predictor"]["counterfactual"]["coverage_options_production_did_not_choose"],
        ),
        *(
            (f"coverage, {name}", f["interval_coverage"])
            for name, f in figures["predictor"]["held_out_scenarios"].items()
        ),
        *(
            (f"planner choices changed, pessimism {r['pessimism']:g}", r["changed_vs_first"])
            for r in figures["planner"]["pessimism_on_held_out_contexts"]["by_pessimism"]
        ),
        ("ONNX vs scikit-learn (max)", f"{max(figures['fidelity'].values()):.2e}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def _write(out: Path, name: str, text: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def _recorded(path: Path | None, allow_drift: bool) -> dict[str, Any] | None:
    if path is None:
        return None
    recorded: dict[str, Any] = json.loads(path.read_text())
    if recorded.get("schema") != run_manifest.SCHEMA:
        console.print(f"[red]`{path}` is not a run manifest ({run_manifest.SCHEMA})[/]")
        raise typer.Exit(2)
    return recorded


def _check_drift(recorded: dict[str, Any], scenarios: Any, root: Path, allow: bool) -> None:
    problems = run_manifest.drift(recorded, scenarios, root)
    for p in problems:
        console.print(f"[yellow]differs from the manifest: {p}[/]")
    if problems and not allow:
        console.print("[red]refusing to rerun a different experiment (--allow-drift to force)[/]")
        raise typer.Exit(2)


def _finish(recorded: dict[str, Any] | None, digest: str) -> None:
    if recorded is None:
        return
    same = recorded.get("results_sha256") == digest
    colour, word = ("green", "identical to") if same else ("red", "DIFFERENT from")
    console.print(f"[{colour}]results {word} the manifest's (sha256 {digest[:16]})[/]")
    if not same:
        raise typer.Exit(1)


@learning_app.command()
def compare(
    scenarios: Annotated[str | None, typer.Option(help="Comma-separated; default all.")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Independent replications K.")] = 3,
    base_seed: Annotated[int, typer.Option(help="First seed (train uses 0-2).")] = 100,
    episodes: Annotated[int, typer.Option(min=1, help="On-policy episodes per seed.")] = 4,
    pool_episodes: Annotated[int, typer.Option(help="Forked episodes per seed.")] = 2,
    pool_worlds: Annotated[int, typer.Option(min=2, help="Monte Carlo worlds per fork.")] = 3,
    jobs_per_episode: Annotated[
        int | None, typer.Option(min=1, help="Override (quick runs).")
    ] = None,
    policies: Annotated[str | None, typer.Option(help="Comma-separated; default all.")] = None,
    planner_pessimism: Annotated[str, typer.Option(help="Extra planner variants.")] = "0",
    policies_dir: Annotated[Path, typer.Option(help="Policies folder.")] = Path("policies"),
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("out/compare"),
    from_manifest: Annotated[Path | None, typer.Option(help="Rerun a recorded run.")] = None,
    allow_drift: Annotated[bool, typer.Option(help="Rerun even if inputs changed.")] = False,
) -> None:
    """Every candidate and baseline on every scenario, both truths; intervals over seeds."""
    from service.learning.compare import (
        PRODUCTION,
        CompareSpec,
        load_candidates,
        run_compare,
        steps,
    )
    from service.learning.summary import summary_markdown

    recorded = _recorded(from_manifest, allow_drift)
    if recorded is not None:
        spec = CompareSpec.from_dict(recorded["spec"])
    else:
        spec = CompareSpec(
            scenarios=_csv(scenarios) or CompareSpec().scenarios,
            seeds=tuple(range(base_seed, base_seed + seeds)),
            episodes=episodes,
            pool_episodes=pool_episodes,
            pool_worlds=pool_worlds,
            jobs_per_episode=jobs_per_episode,
            policies=_csv(policies),
            planner_pessimism=_csv(planner_pessimism, float, "'--planner-pessimism'") or (),
            policies_dir=str(policies_dir),
        )
    root = Path(spec.policies_dir)
    worlds = [spec.scenario(s) for s in spec.scenarios]
    if recorded is not None:
        _check_drift(recorded, worlds, root, allow_drift)
    n = len(load_candidates(root, spec.policies, spec.planner_pessimism))
    with _progress() as progress:
        task = progress.add_task("compare", total=steps(spec, n))
        results, timings = run_compare(
            spec, root, lambda what: progress.update(task, advance=1, description=what)
        )
    digest = _write(out, "results.json", dumps(results))
    _write(out, "timings.json", dumps(timings))
    manifest = run_manifest.build("compare", spec.to_dict(), worlds, root, digest)
    _write(out, "run_manifest.json", dumps(manifest))
    _write(out, "summary.md", summary_markdown(results))
    table = Table(
        title=f"candidate - production (full intervals in {out}/summary.md)",
        caption="n.d.: no detectable difference (the interval covers 0)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        title_justify="left",
    )
    for name in ("scenario", "policy", "on-policy", "per-decision", "raw fav. infeasible"):
        table.add_column(name, overflow="fold", justify="left" if len(name) < 9 else "right")
    for scenario, by_policy in results["scenarios"].items():
        for name, summary in by_policy.items():
            if name == PRODUCTION:
                continue
            i = summary["intervals"]
            table.add_row(
                scenario,
                name,
                _short(i["on_policy_vs_production"]),
                _short(i["per_decision_vs_production"]),
                f"{i['raw_favourite_infeasible_rate']['mean']:.3f}",
            )
    console.print(table)
    _finish(recorded, digest)


def _short(i: dict[str, Any]) -> str:
    """``+0.100 wins`` / ``-0.600 loses`` / ``+0.000 n.d.``: the mean and its verdict."""
    from service.learning.compare import verdict

    word = verdict(i)
    return f"{i['mean']:+.3f} {'n.d.' if word == 'no difference' else word}"


@learning_app.command()
def sweep(
    families: Annotated[str | None, typer.Option(help="Comma-separated; default all.")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Independent replications K.")] = 3,
    base_seed: Annotated[int, typer.Option(help="First seed (train uses 0-2).")] = 100,
    episodes: Annotated[int, typer.Option(min=1, help="Episodes per seed and point.")] = 4,
    jobs_per_episode: Annotated[
        int | None, typer.Option(min=1, help="Override (quick runs).")
    ] = None,
    policies: Annotated[str | None, typer.Option(help="Comma-separated candidates.")] = None,
    policies_dir: Annotated[Path, typer.Option(help="Policies folder.")] = Path("policies"),
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("out/sweep"),
    from_manifest: Annotated[Path | None, typer.Option(help="Rerun a recorded run.")] = None,
    allow_drift: Annotated[bool, typer.Option(help="Rerun even if inputs changed.")] = False,
) -> None:
    """On-policy value vs production as workload mix, degradation and arrival rate shift."""
    from service.learning.plots import sweep_figure
    from service.learning.sweep import DEFAULT_POLICIES, SweepSpec, run_sweep, to_csv

    recorded = _recorded(from_manifest, allow_drift)
    if recorded is not None:
        spec = SweepSpec.from_dict(recorded["spec"])
    else:
        spec = SweepSpec(
            families=_csv(families, str, "'--families'", SweepSpec().families)
            or SweepSpec().families,
            seeds=tuple(range(base_seed, base_seed + seeds)),
            episodes=episodes,
            jobs_per_episode=jobs_per_episode,
            policies=_csv(policies) or DEFAULT_POLICIES,
            policies_dir=str(policies_dir),
        )
    root = Path(spec.policies_dir)
    from service.environment import load_scenario

    scenarios = [load_scenario("train"), load_scenario("mix_shift")]
    if recorded is not None:
        _check_drift(recorded, scenarios, root, allow_drift)
    with _progress() as progress:
        task = progress.add_task("sweep", total=spec.points())
        doc = run_sweep(spec, root, lambda what: progress.update(task, advance=1, description=what))
    digest = _write(out, "sweep.json", dumps(doc))
    _write(out, "sweep.csv", to_csv(doc))
    sweep_figure(doc, out / "sweep.png")
    manifest = run_manifest.build("sweep", spec.to_dict(), scenarios, root, digest)
    _write(out, "run_manifest.json", dumps(manifest))
    console.print(f"wrote {out}/sweep.json, sweep.csv, sweep.png, run_manifest.json")
    _finish(recorded, digest)


if __name__ == "__main__":
    learning_app()
