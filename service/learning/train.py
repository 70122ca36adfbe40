"""Build time: ``understudy train`` — learn from simulated logs, export, verify.

Steps (seeded; scikit-learn and BLAS single-threaded, so a rerun on the same
library versions writes byte-identical ONNX):

1. log production on the training scenario: ``episodes`` episodes of seed
   ``seed`` to fit on, ``held_out_episodes`` of seed ``seed + 1`` to measure
   on, and ``scenario_episodes`` of seed ``seed + 2`` on each held-out
   scenario (how calibration degrades under shift);
2. fit the outcome predictor (`fit.fit_outcome_predictor`) and measure it
   (`assess.predictor_figures`, `assess.counterfactual_coverage`);
3. the LCB planner on that predictor: choices and per-decision value at
   several pessimisms on forked held-out contexts (`assess.pessimism_figures`);
4. fit the importance-weighted scorer (`fit.fit_iwr_scorer`) and measure it;
5. export through the Gavel build's helpers (`build_models.export`), write
   manifests with training-data summaries and figures, then load the folder
   through the service's registry (sha256, feature hash, shapes,
   `check_policy`) and require ONNX to equal the in-memory models to 1e-4.

The planner's folder holds the predictor's exact bytes (same sha256): a
planning policy predicts with its own model, so it loads on its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import skl2onnx
import sklearn
from numpy.typing import NDArray
from rich.progress import Progress
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from service.contract import DEFAULT_FEATURES, FEATURE_NAMES, N_FEATURES
from service.environment import World, build_pool, load_scenario
from service.learning import assess, fit
from service.learning.build_models import export
from service.learning.build_models.__main__ import PROVIDERS, summarise
from service.learning.build_models.predictor_fit import QuantileModels
from service.learning.logs import LoggedRows, collect
from service.policies.manifest import (
    MANIFEST_FILE,
    Manifest,
    ManifestKind,
    PlanningSpec,
    TensorSpec,
    dump_manifest,
)
from service.policies.onnx_policy import OnnxPolicy, OnnxPredictor
from service.policies.outcome_features import (
    N_OUTCOME_FEATURES,
    OUTCOME_FEATURE_NAMES,
    OUTCOME_FEATURES,
)
from service.policies.planner import LcbPlanner
from service.policies.probabilities import ProbabilityRule, RuleKind
from service.policies.registry import load_registry

PREDICTOR_NAME = "learned-outcome"
PLANNER_NAME = "lcb-planner"
SCORER_NAME = "iwr-scorer"
HELD_OUT_SCENARIOS = ("mix_shift", "new_class", "degraded", "surge", "fragmented")
FIDELITY_TOLERANCE = 1e-4
ARGMAX = ProbabilityRule(RuleKind.ARGMAX)


@dataclass(frozen=True)
class TrainSettings:
    """What `train` does; every field is recorded in the manifests' ``build``."""

    seed: int = 0
    episodes: int = 120
    held_out_episodes: int = 40
    scenario_episodes: int = 8
    pool_episodes: int = 2
    pool_worlds: int = 3
    pessimism: float = 1.0
    packing_weight: float = 0.05
    pessimism_grid: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    jobs_per_episode: int | None = None  # None: the scenario's own (tests use fewer)
    config: fit.LearningConfig = dataclasses.field(default_factory=fit.LearningConfig)


class SklearnRows:
    """`RowPredictor` over the in-memory quantile models (what the ONNX graph computes)."""

    def __init__(self, models: QuantileModels) -> None:
        self.models = models

    def predict_rows(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """Throughput quantiles ``(n, 3)``, float32 like the ONNX output."""
        return self.models.predict(x).astype(np.float32)


def _world(name: str, settings: TrainSettings) -> World:
    scenario = load_scenario(name)
    if settings.jobs_per_episode is not None:
        scenario = scenario.replace(jobs_per_episode=settings.jobs_per_episode)
    return World(scenario)


def _collect(progress: Progress, world: World, seed: int, n: int, what: str) -> LoggedRows:
    task = progress.add_task(f"log {n} episodes: {what}", total=n)
    return collect(world, seed, range(n), lambda _e: progress.advance(task))


def _manifest(out: Path, name: str, sha: str, **fields: Any) -> Manifest:
    return Manifest(
        name=name,
        version="1.0.0",
        model_file="model.onnx",
        model_sha256=sha,
        execution_providers=PROVIDERS,
        time_budget_ms=20.0,
        directory=out / name,
        **fields,
    )


def _write(manifest: Manifest) -> None:
    (manifest.directory / MANIFEST_FILE).write_text(dump_manifest(manifest))


def _source(settings: TrainSettings, rows: LoggedRows) -> str:
    return (
        f"simulated production logs (service.environment.log_episode): scenario `{rows.scenario}`,"
        f" seed {settings.seed}, episodes 0-{settings.episodes - 1}, one row per logged decision"
        " (the option production chose, its propensity and the job's delayed outcome)"
    )


def _manifests(
    out: Path,
    settings: TrainSettings,
    rows: LoggedRows,
    shas: dict[str, str],
    figures: dict[str, Any],
    build: dict[str, Any],
) -> list[Manifest]:
    families = tuple(sorted({t.split(" (")[0] for t in rows.job_type.tolist()}))
    seen = {
        "hardware": tuple(sorted(set(rows.hardware.tolist()))),
        "kinds": ("train",),
        "families": families,
    }
    outcome_summary = summarise(
        rows.outcome_x, OUTCOME_FEATURE_NAMES, _source(settings, rows), **seen
    )
    outcome_io = {
        "feature_version": OUTCOME_FEATURES.version,
        "feature_hash": OUTCOME_FEATURES.definition_hash,
        "inputs": (TensorSpec(export.INPUT, "float32", ("N", N_OUTCOME_FEATURES)),),
        "outputs": (
            TensorSpec(export.PREDICTOR_OUTPUT, "float32", ("N", 3)),
            TensorSpec(export.SUPPORT_OUTPUT, "float32", ("N", 1)),
        ),
        "training_data": outcome_summary,
        "predictor": None,
    }
    predictor = _manifest(
        out,
        PREDICTOR_NAME,
        shas[PREDICTOR_NAME],
        kind=ManifestKind.PREDICTOR,
        description="Throughput (steps/s of the whole job) a placement would get, q10/q50/q90:"
        " gradient-boosted quantile trees on log throughput learned from simulated production"
        " logs, conformalized 80% interval (folds of whole episodes)",
        probabilities=None,
        evaluation={"quantiles": [0.1, 0.5, 0.9], "unit": "steps/s", **figures["predictor"]},
        build={**build, "config": dataclasses.asdict(settings.config)},
        **outcome_io,
    )
    planner = _manifest(
        out,
        PLANNER_NAME,
        shas[PLANNER_NAME],
        kind=ManifestKind.POLICY,
        description="Pessimistic planner: argmax over options of the learned outcome predictor's"
        " lower confidence bound of log throughput, log q50 - pessimism (log q50 - log q10),"
        " minus packing_weight x free_after; the model is learned-outcome's, byte for byte",
        probabilities=ARGMAX,
        planning=PlanningSpec(settings.pessimism, settings.packing_weight),
        evaluation=figures["planner"],
        build={**build, "model_of": PREDICTOR_NAME},
        **outcome_io,
    )
    scorer = _manifest(
        out,
        SCORER_NAME,
        shas[SCORER_NAME],
        kind=ManifestKind.POLICY,
        description="Contextual-bandit scorer: importance-weighted regression (weights"
        f" min(1/propensity, {settings.config.weight_clip:g})) of the logged reward on the chosen"
        " option's contract features, gradient-boosted trees; argmax over feasible options",
        feature_version=DEFAULT_FEATURES.version,
        feature_hash=DEFAULT_FEATURES.definition_hash,
        inputs=(TensorSpec(export.INPUT, "float32", ("N", N_FEATURES)),),
        outputs=(TensorSpec(export.SCORER_OUTPUT, "float32", ("N", 1)),),
        probabilities=ARGMAX,
        predictor=PREDICTOR_NAME,
        training_data=summarise(rows.contract_x, FEATURE_NAMES, _source(settings, rows), **seen),
        evaluation=figures["scorer"],
        build={**build, "weight_clip": settings.config.weight_clip},
    )
    return [predictor, planner, scorer]


def _verify(out: Path, models: QuantileModels, scorer: Any, rows: LoggedRows) -> dict[str, float]:
    """Load `out` through the registry; max |ONNX - in-memory| per artifact."""
    registry = load_registry(out, include_baselines=False)
    predictor = registry.predictors.get(PREDICTOR_NAME)
    planner = registry.policies.get(PLANNER_NAME)
    onnx_scorer = registry.policies.get(SCORER_NAME)
    if not (
        isinstance(predictor, OnnxPredictor)
        and isinstance(planner, LcbPlanner)
        and isinstance(onnx_scorer, OnnxPolicy)
    ):
        raise SystemExit(f"trained artifacts were refused: {dict(registry.refused)}")
    want = np.log(models.predict(rows.outcome_x))
    got = np.log(predictor.predict_rows(rows.outcome_x).astype(np.float64))
    planner_got = np.log(planner.predictor.predict_rows(rows.outcome_x).astype(np.float64))
    s_want = np.asarray(scorer.predict(rows.contract_x), dtype=np.float64)
    s_got = onnx_scorer.scores(rows.contract_x).astype(np.float64)
    fidelity = {
        "predictor_max_abs_diff_log": float(np.max(np.abs(got - want))),
        "planner_max_abs_diff_log": float(np.max(np.abs(planner_got - want))),
        "scorer_max_abs_diff": float(np.max(np.abs(s_got - s_want))),
    }
    if max(fidelity.values()) > FIDELITY_TOLERANCE:
        raise SystemExit(f"ONNX differs from scikit-learn: {fidelity}")
    return fidelity


def train(out: Path, settings: TrainSettings, progress: Progress) -> dict[str, Any]:
    """Everything the module docstring lists; returns the figures written to the manifests."""
    s = settings
    build = {
        "command": "understudy train",
        "settings": {k: v for k, v in dataclasses.asdict(s).items() if k != "config"},
        "scikit-learn": sklearn.__version__,
        "skl2onnx": skl2onnx.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
    }
    figures: dict[str, Any] = {"predictor": {}, "planner": {}, "scorer": {}}
    with threadpool_limits(1):
        world = _world("train", s)
        rows = _collect(progress, world, s.seed, s.episodes, "train (fit)")
        held = _collect(progress, world, s.seed + 1, s.held_out_episodes, "train (held out)")
        task = progress.add_task("fork held-out contexts (ground truth)", total=1)
        pool = build_pool(world, s.seed + 1, s.pool_episodes, s.pool_worlds)
        progress.update(task, completed=1)

        task = progress.add_task("fit outcome predictor (cross-conformal)", total=1)
        models, fit_figures = fit.fit_outcome_predictor(rows, s.config, s.seed)
        rows_model = SklearnRows(models)
        p = figures["predictor"]
        p.update(fit_figures)
        p["held_out"] = assess.predictor_figures(rows_model, rows, held)
        p["counterfactual"] = assess.counterfactual_coverage(rows_model, pool)
        progress.update(task, completed=1)
        by_scenario = {}
        for name in HELD_OUT_SCENARIOS:
            other = _collect(progress, _world(name, s), s.seed + 2, s.scenario_episodes, name)
            by_scenario[name] = assess.predictor_figures(rows_model, rows, other)["log_throughput"]
        p["held_out_scenarios"] = by_scenario

        task = progress.add_task("planner: pessimism vs choices", total=1)
        spec = PlanningSpec(s.pessimism, s.packing_weight)
        planner = LcbPlanner(PLANNER_NAME, "1.0.0", rows_model, spec, ARGMAX)
        figures["planner"] = {
            "pessimism_on_held_out_contexts": assess.pessimism_figures(
                planner, pool, s.pessimism_grid
            )
        }
        progress.update(task, completed=1)

        task = progress.add_task("fit importance-weighted scorer", total=1)
        scorer = fit.fit_iwr_scorer(rows, s.config, s.seed)
        weights = fit.iwr_weights(rows.propensity, s.config.weight_clip)
        in_memory = assess.ScoreFnPolicy(
            SCORER_NAME, lambda x: np.asarray(scorer.predict(x), dtype=np.float32), ARGMAX
        )
        figures["scorer"] = {
            "weights_clipped_share": round(float((1.0 / rows.propensity > weights).mean()), 4),
            "held_out_contexts": assess.policy_value(in_memory, pool),
        }
        progress.update(task, completed=1)

        task = progress.add_task("export ONNX, write manifests, verify through the registry")
        shas = {}
        graph = export.predictor_onnx(models, N_OUTCOME_FEATURES, "learned_outcome")
        for name in (PREDICTOR_NAME, PLANNER_NAME):
            shas[name] = export.write_model(graph, out / name / "model.onnx")
        graph = export.scorer_onnx(scorer, N_FEATURES, "iwr_scorer")
        shas[SCORER_NAME] = export.write_model(graph, out / SCORER_NAME / "model.onnx")
        manifests = _manifests(out, s, rows, shas, figures, build)
        for m in manifests:
            _write(m)
        figures["fidelity"] = _verify(out, models, scorer, held)
        for m in manifests:
            evaluation = {**m.evaluation, "onnx_vs_sklearn": figures["fidelity"]}
            _write(dataclasses.replace(m, evaluation=evaluation))
        progress.update(task, completed=1, total=1)
    figures["rows"] = {"train": rows.n, "held_out": held.n, "pool_contexts": pool.n}
    return figures
