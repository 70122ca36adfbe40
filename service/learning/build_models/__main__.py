"""``python -m service.learning.build_models``: fit, evaluate, export, verify.

Steps: read the Gavel table and add its gang-shape rows (`shape_rows`: the
measured placement table's ratios on Gavel's consolidated rates); evaluate
the predictor on held-out scales and leave-one-family-out; fit it on all rows
with its conformal offset and training support; export it;
take the simulator's training traffic and fit the scoring MLP on a target
derived from the predictor; export it; write both manifests (sha256, feature hashes, training
summary, figures); then load the output folder through the service's own
registry — sha256, shapes, `check_policy` — and record how far ONNX outputs
are from the in-memory models'. Seeded and single-threaded (BLAS included), so
a rerun on the same library versions writes the same bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import skl2onnx
import sklearn
from numpy.typing import NDArray
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from service.contract import DEFAULT_FEATURES, FEATURE_NAMES, N_FEATURES
from service.learning.build_models import export, predictor_fit, scorer_fit, shape_rows
from service.learning.build_models.gavel import (
    REPO_ROOT,
    GavelTable,
    isolated_csv_path,
    load_gavel,
)
from service.policies.base import ScoringBatch
from service.policies.manifest import (
    MANIFEST_FILE,
    Manifest,
    ManifestKind,
    TensorSpec,
    TrainingSummary,
    dump_manifest,
)
from service.policies.onnx_policy import OnnxPolicy, OnnxPredictor
from service.policies.predictor_features import (
    N_PREDICTOR_FEATURES,
    PREDICTOR_FEATURE_NAMES,
    PREDICTOR_FEATURES,
    parse_job_type,
)
from service.policies.probabilities import ProbabilityRule, RuleKind
from service.policies.registry import load_registry

PREDICTOR_NAME = "gavel-throughput"
SCORER_NAME = "gavel-scorer"
PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")
FIDELITY_TOLERANCE = 1e-4
GAVEL_SOURCE = (
    "gavel-throughputs/isolated_throughputs.csv, simulation column (stanford-futuredata/gavel"
    " c4fa400, MIT); scale-1 unconsolidated duplicates and 0.0 (cannot run) rows dropped"
)


def summarise(
    x: NDArray[np.float32], names: tuple[str, ...], source: str, **seen: tuple[str, ...]
) -> TrainingSummary:
    """Means and 5/50/95% quantiles per column, for drift checks."""
    q = np.quantile(x.astype(np.float64), [0.05, 0.5, 0.95], axis=0)
    return TrainingSummary(
        source=source,
        n_rows=len(x),
        feature_means={n: round(float(v), 6) for n, v in zip(names, x.mean(axis=0), strict=True)},
        feature_quantiles={
            label: {n: round(float(v), 6) for n, v in zip(names, row, strict=True)}
            for label, row in zip(("q05", "q50", "q95"), q, strict=True)
        },
        hardware_classes=seen.get("hardware", ()),
        workload_kinds=seen.get("kinds", ()),
        model_families=seen.get("families", ()),
    )


def _manifest(name: str, kind: ManifestKind, sha: str, out: Path, **kw: Any) -> Manifest:
    return Manifest(
        name=name,
        version="1.0.0",
        kind=kind,
        model_file="model.onnx",
        model_sha256=sha,
        execution_providers=PROVIDERS,
        time_budget_ms=20.0,
        directory=out / name,
        **kw,
    )


def _write(manifest: Manifest) -> None:
    (manifest.directory / MANIFEST_FILE).write_text(dump_manifest(manifest))


def _predictor_manifest(
    out: Path, sha: str, table: GavelTable, figures: dict[str, Any], build_info: dict[str, Any]
) -> Manifest:
    summary = summarise(
        table.features,
        PREDICTOR_FEATURE_NAMES,
        f"{GAVEL_SOURCE}; {shape_rows.SHAPE_SOURCE}",
        hardware=tuple(sorted(set(table.hardware.tolist()))),
        kinds=("train",),
        families=tuple(sorted(set(table.family.tolist()))),
    )
    return _manifest(
        PREDICTOR_NAME,
        ManifestKind.PREDICTOR,
        sha,
        out,
        description="Gavel training throughput (steps/s of the whole job), q10/q50/q90,"
        " gradient-boosted quantile trees on log throughput, conformalized 80% interval",
        feature_version=PREDICTOR_FEATURES.version,
        feature_hash=PREDICTOR_FEATURES.definition_hash,
        inputs=(TensorSpec(export.INPUT, "float32", ("N", N_PREDICTOR_FEATURES)),),
        outputs=(
            TensorSpec(export.PREDICTOR_OUTPUT, "float32", ("N", 3)),
            TensorSpec(export.SUPPORT_OUTPUT, "float32", ("N", 1)),
        ),
        probabilities=None,
        predictor=None,
        training_data=summary,
        evaluation={"quantiles": [0.1, 0.5, 0.9], "unit": "steps/s", **figures},
        build=build_info,
    )


def _scorer_manifest(
    out: Path, sha: str, train: ScoringBatch, figures: dict[str, Any], build_info: dict[str, Any]
) -> Manifest:
    requests = train.requests
    summary = summarise(
        train.features,
        FEATURE_NAMES,
        f"every request of simulated scenario `{scorer_fit.TRAINING_SCENARIO}`, seed"
        f" {build_info['seed']}, episodes 0-{scorer_fit.TRAINING_EPISODES - 1}:"
        f" {len(requests)} requests",
        hardware=tuple(sorted({h.name for r in requests for h in r.state.hardware})),
        kinds=tuple(sorted({str(r.workload.kind) for r in requests})),
        families=tuple(sorted({parse_job_type(r.workload.model_family).family for r in requests})),
    )
    return _manifest(
        SCORER_NAME,
        ManifestKind.POLICY,
        sha,
        out,
        description="Demonstration scorer: StandardScaler + MLP (32, 16) over contract"
        " features, distilled from the Gavel predictor's log median throughput minus"
        " load penalties on the simulator's training traffic; softmax over feasible options",
        feature_version=DEFAULT_FEATURES.version,
        feature_hash=DEFAULT_FEATURES.definition_hash,
        inputs=(TensorSpec(export.INPUT, "float32", ("N", N_FEATURES)),),
        outputs=(TensorSpec(export.SCORER_OUTPUT, "float32", ("N", 1)),),
        probabilities=ProbabilityRule(RuleKind.SOFTMAX, temperature=0.25),
        predictor=PREDICTOR_NAME,
        training_data=summary,
        evaluation={"target": scorer_fit.TARGET_FORMULA, **figures},
        build={
            **build_info,
            "hidden_layers": [32, 16],
            # read by service.learning.training_summaries, as `understudy train`'s settings
            "settings": {
                "scenario": scorer_fit.TRAINING_SCENARIO,
                "seed": build_info["seed"],
                "episodes": scorer_fit.TRAINING_EPISODES,
            },
        },
    )


def _with_fidelity(manifest: Manifest, figures: dict[str, Any]) -> None:
    _write(dataclasses.replace(manifest, evaluation={**manifest.evaluation, **figures}))


def build(out: Path, seed: int, console: Console) -> dict[str, Any]:
    """Everything the module docstring lists; returns the headline figures."""
    build_info: dict[str, Any] = {
        "command": "python -m service.learning.build_models",
        "seed": seed,
        "scikit-learn": sklearn.__version__,
        "skl2onnx": skl2onnx.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
    }
    config = predictor_fit.PredictorConfig(seed=seed)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress, threadpool_limits(1):

        def step(text: str) -> TaskID:
            return progress.add_task(text, total=1)

        t = step(f"read Gavel table {isolated_csv_path()}")
        gavel = load_gavel()
        table = shape_rows.with_shape_rows(gavel)
        progress.update(
            t,
            completed=1,
            description=f"read Gavel table: {len(gavel)} rows; {len(table)} with gang shapes",
        )
        t = step("evaluate predictor on held-out scales, fit on all rows")
        models, figures = predictor_fit.fit_predictor(table, config)
        progress.update(t, completed=1)
        t = step("leave-one-family-out")
        figures["leave_one_family_out"] = predictor_fit.leave_one_family_out(table, config)
        progress.update(t, completed=1)
        t = step("export predictor to ONNX")
        graph = export.predictor_onnx(models, N_PREDICTOR_FEATURES)
        sha = export.write_model(graph, out / PREDICTOR_NAME / "model.onnx")
        info = {**build_info, "config": dataclasses.asdict(config)}
        predictor = _predictor_manifest(out, sha, table, figures, info)
        _write(predictor)
        progress.update(t, completed=1)

        t = step("simulated training traffic, distillation target, fit scoring MLP")
        train = scorer_fit.simulated_batch(seed, range(scorer_fit.TRAINING_EPISODES))
        held = scorer_fit.simulated_batch(seed + 1, range(scorer_fit.HELD_OUT_EPISODES))
        pipeline = scorer_fit.fit_scorer(train, scorer_fit.target(train, models), seed)
        scorer_figures = scorer_fit.evaluate_scorer(pipeline, held, scorer_fit.target(held, models))
        progress.update(t, completed=1)
        t = step("export scoring policy to ONNX")
        graph = export.scorer_onnx(pipeline, N_FEATURES)
        sha = export.write_model(graph, out / SCORER_NAME / "model.onnx")
        scorer = _scorer_manifest(out, sha, train, scorer_figures, build_info)
        _write(scorer)
        progress.update(t, completed=1)

        t = step("load through the registry (sha256, shapes, check_policy), compare outputs")
        registry = load_registry(out, include_baselines=False)
        onnx_predictor = registry.predictors.get(PREDICTOR_NAME)
        onnx_scorer = registry.policies.get(SCORER_NAME)
        if not isinstance(onnx_predictor, OnnxPredictor) or not isinstance(onnx_scorer, OnnxPolicy):
            raise SystemExit(f"built artifacts were refused: {dict(registry.refused)}")
        onnx_q = onnx_predictor.predict_rows(table.features)
        q_diff = float(np.max(np.abs(np.log(onnx_q) - np.log(models.predict(table.features)))))
        onnx_s = onnx_scorer.scores(held.features)
        s_diff = float(np.max(np.abs(onnx_s - pipeline.predict(held.features))))
        if max(q_diff, s_diff) > FIDELITY_TOLERANCE:
            raise SystemExit(f"ONNX differs from scikit-learn: {q_diff=} {s_diff=}")
        _with_fidelity(predictor, {"onnx_vs_sklearn_max_abs_diff_log": q_diff})
        _with_fidelity(scorer, {"onnx_vs_sklearn_max_abs_diff": s_diff})
        progress.update(t, completed=1)
    return {"predictor": figures, "scorer": scorer_figures, "fidelity": (q_diff, s_diff)}


def _report(console: Console, result: dict[str, Any]) -> None:
    p = result["predictor"]
    table = Table(title="Gavel predictor, held-out scales")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("mean |log error| (model)", p["mean_abs_log_error"]),
        ("mean |log error| (per job type x class mean)", p["baseline_mean_abs_log_error"]),
        ("MAPE (model)", p["mape"]),
        ("MAPE (baseline)", p["baseline_mape"]),
        ("80% interval coverage", p["interval_coverage"]),
        ("conformal offset (log)", p["conformal_offset_log"]),
        ("fastest-class misses (in sample)", len(p["in_sample_fastest_class"]["misses"])),
        ("ONNX vs sklearn, predictor (log)", f"{result['fidelity'][0]:.2e}"),
        ("ONNX vs sklearn, scorer", f"{result['fidelity'][1]:.2e}"),
        ("scorer R^2 / best-option agreement", f"{result['scorer']['r2']} / "
         f"{result['scorer']['best_option_agreement']}"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, build, print the figures."""
    parser = argparse.ArgumentParser(prog="python -m service.learning.build_models")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "policies", help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random choice")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if not isolated_csv_path().exists():
        console.print(f"[red]missing {isolated_csv_path()}; set UNDERSTUDY_SHARED_DATA[/red]")
        return 2
    _report(console, build(args.out, args.seed, console))
    return 0


if __name__ == "__main__":
    sys.exit(main())
