"""Load every ``policies/*/policy.yaml``, verify it, and keep what passes.

Per manifest, in order, each step refusing with a `PolicyLoadError` that
names the policy and the problem:

1. the YAML parses and matches the schema (`service.policies.manifest`);
2. the model file exists and its sha256 equals the manifest's;
3. the feature version and definition hash equal the running feature
   function's (the contract's for policies, the predictor's own for
   predictors) — a model trained on other features is never fed these;
4. inputs and outputs have the names, dtypes and shapes this kind needs, and
   the model agrees with the manifest (checked on the live session);
5. a policy's predictor, if named, has loaded;
6. `check_policy` / `check_predictor` pass on a probe batch.

A policy's ``training_summary.json`` (`service.policies.training_summary`),
when present, is loaded beside it for drift checks; one computed for another
feature definition is refused (the policy still loads, without drift).

Predictors are read with the feature function their manifest names (the
Gavel predictor's, or the outcome features of the predictor learned from
simulated logs). A policy with a ``planning`` block is an `LcbPlanner`: its
model is an outcome predictor (``[N, 22] -> [N, 3]``) it scores with.

A refused manifest never stops the others: the registry loads the rest and
reports the refusals. Predictors load first, so policies can use them. The
built-in baselines are added beside the ONNX policies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from service.checks.drift import with_model_families
from service.contract import DEFAULT_FEATURES, N_FEATURES, FeatureFunction
from service.policies.base import Policy, ScoringBatch
from service.policies.baselines import builtin_baselines
from service.policies.batching import make_batch
from service.policies.check import check_policy, check_predictor
from service.policies.errors import PolicyConformanceError, PolicyLoadError
from service.policies.manifest import MANIFEST_FILE, Manifest, ManifestKind, load_manifest
from service.policies.onnx_policy import OnnxModel, OnnxPolicy, OnnxPredictor
from service.policies.outcome_features import OUTCOME_FEATURES, OutcomeFeatureFunction
from service.policies.planner import LcbPlanner
from service.policies.predictor import Predictor
from service.policies.predictor_features import (
    PREDICTOR_FEATURES,
    PredictorFeatureFunction,
)
from service.policies.synthetic import random_requests
from service.policies.training_summary import TrainingReference, load_summary

log = logging.getLogger(__name__)

DEFAULT_PREDICTOR = "gavel-throughput"
"""The predictor throughput-greedy uses when the registry has it."""


@dataclass(frozen=True)
class Registry:
    """What loaded, and what was refused and why.

    Attributes:
        policies: name -> policy (ONNX policies and baselines).
        predictors: name -> predictor.
        manifests: name -> manifest of every loaded ONNX artifact.
        refused: name (or folder) -> the load error.
        training_summaries: ONNX policy name -> its training reference (drift).
        summaries_refused: policy name -> why its training summary was refused.
    """

    policies: Mapping[str, Policy]
    predictors: Mapping[str, Predictor]
    manifests: Mapping[str, Manifest] = field(default_factory=dict)
    refused: Mapping[str, PolicyLoadError] = field(default_factory=dict)
    training_summaries: Mapping[str, TrainingReference] = field(default_factory=dict)
    summaries_refused: Mapping[str, PolicyLoadError] = field(default_factory=dict)

    @property
    def time_budgets_s(self) -> dict[str, float]:
        """Per ONNX policy, its manifest's time budget in seconds."""
        return {n: m.time_budget_ms / 1e3 for n, m in self.manifests.items()}


@lru_cache(maxsize=1)
def probe_batch() -> ScoringBatch:
    """Eight synthetic requests plus one where nothing fits (no class has 100 GB)."""
    requests = random_requests(seed=20240601, n_requests=8, n_nodes=24, max_options=12)
    last = requests[-1]
    huge = dataclasses.replace(last.workload, accelerator_memory_gb=100.0)
    requests.append(dataclasses.replace(last, request_id="probe-infeasible", workload=huge))
    return make_batch(requests)


def _expect_shapes(m: Manifest, n_in: int, n_out: tuple[int, ...]) -> None:
    """The kind's fixed contract: one float32 input ``[N, n_in]``, one output ``[N, *n_out]``."""
    if len(m.inputs) != 1:
        raise PolicyLoadError(m.name, f"`inputs` must list one tensor, got {len(m.inputs)}")
    spec = m.inputs[0]
    if len(spec.shape) != 2 or not isinstance(spec.shape[0], str) or spec.shape[1] != n_in:
        raise PolicyLoadError(
            m.name, f"`inputs[0].shape` must be [N, {n_in}], got {list(spec.shape)}"
        )
    if spec.dtype != "float32":
        raise PolicyLoadError(m.name, f"`inputs[0].dtype` must be float32, got {spec.dtype}")
    out = m.outputs[0].shape
    allowed = {n_out, ()} if n_out == (1,) else {n_out}  # a policy may emit [N] scores
    if not out or not isinstance(out[0], str) or tuple(out[1:]) not in allowed:
        raise PolicyLoadError(
            m.name, f"`outputs[0].shape` must be [N, {', '.join(map(str, n_out))}], got {list(out)}"
        )


class _Loader:
    """One pass over a folder of manifests."""

    def __init__(
        self,
        features: FeatureFunction,
        predictor_features: PredictorFeatureFunction,
        available_providers: Sequence[str] | None,
        probe: ScoringBatch,
        intra_op_threads: int,
    ) -> None:
        self.features = features
        self.predictor_features = predictor_features
        self.available_providers = available_providers
        self.probe = probe
        self.intra_op_threads = intra_op_threads
        self.predictors: dict[str, Predictor] = {}

    def _verified_bytes(self, m: Manifest) -> bytes:
        try:
            data = m.model_path.read_bytes()
        except OSError as exc:
            raise PolicyLoadError(m.name, f"cannot read model `{m.model_file}`: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != m.model_sha256:
            raise PolicyLoadError(
                m.name,
                f"sha256 mismatch: `{m.model_file}` hashes to {digest}, manifest says"
                f" {m.model_sha256}",
            )
        return data

    def _predictor_features(self, m: Manifest) -> PredictorFeatureFunction | OutcomeFeatureFunction:
        """The Gavel features, or the outcome features when the manifest names them."""
        if m.feature_version == OUTCOME_FEATURES.version:
            return OUTCOME_FEATURES
        return self.predictor_features

    def _check_features(self, m: Manifest) -> None:
        scores_contract = m.kind is ManifestKind.POLICY and m.planning is None
        want = self.features if scores_contract else self._predictor_features(m)
        if m.feature_version != want.version or m.feature_hash != want.definition_hash:
            raise PolicyLoadError(
                m.name,
                f"feature definition mismatch: manifest has `{m.feature_version}` hash"
                f" {m.feature_hash[:12]}, the running feature function is `{want.version}` hash"
                f" {want.definition_hash[:12]}; rebuild the model for the current features",
            )

    def _shared_predictor(self, m: Manifest) -> OnnxPredictor | None:
        """A loaded predictor of the very same model file and features as planner `m`'s:
        sharing it runs the model once per batch for both (its result is cached per batch)."""
        for predictor in self.predictors.values():
            if not isinstance(predictor, OnnxPredictor):
                continue
            same_file = predictor.model.manifest.model_sha256 == m.model_sha256
            if same_file and predictor.features is self._predictor_features(m):
                return predictor
        return None

    def load(self, m: Manifest) -> OnnxPolicy | OnnxPredictor | LcbPlanner:
        data = self._verified_bytes(m)
        self._check_features(m)
        if m.kind is ManifestKind.POLICY and m.planning is None:
            _expect_shapes(m, N_FEATURES, (1,))
        else:
            _expect_shapes(m, len(self._predictor_features(m).names), (3,))
        if m.planning is not None and (shared := self._shared_predictor(m)) is not None:
            assert m.probabilities is not None  # parse_manifest requires it for policies
            planner = LcbPlanner(m.name, m.version, shared, m.planning, m.probabilities)
            try:
                check_policy(planner, self.probe)
            except PolicyConformanceError as exc:
                raise PolicyLoadError(m.name, exc.problem) from exc
            return planner
        model = OnnxModel(
            m,
            data,
            available_providers=self.available_providers,
            intra_op_threads=self.intra_op_threads,
        )
        try:
            if m.kind is ManifestKind.PREDICTOR:
                predictor = OnnxPredictor(model, self._predictor_features(m))
                check_predictor(predictor, self.probe)
                return predictor
            assert m.probabilities is not None  # parse_manifest requires it for policies
            if m.planning is not None:
                rows = OnnxPredictor(model, self._predictor_features(m))
                planner = LcbPlanner(m.name, m.version, rows, m.planning, m.probabilities)
                check_policy(planner, self.probe)
                return planner
            if m.predictor is not None and m.predictor not in self.predictors:
                raise PolicyLoadError(
                    m.name, f"uses predictor `{m.predictor}`, which is not loaded"
                )
            used = self.predictors[m.predictor] if m.predictor is not None else None
            policy = OnnxPolicy(model, m.probabilities, used)
            check_policy(policy, self.probe)
            return policy
        except PolicyConformanceError as exc:
            raise PolicyLoadError(m.name, exc.problem) from exc


def load_registry(
    root: Path,
    *,
    features: FeatureFunction = DEFAULT_FEATURES,
    predictor_features: PredictorFeatureFunction = PREDICTOR_FEATURES,
    available_providers: Sequence[str] | None = None,
    include_baselines: bool = True,
    probe: ScoringBatch | None = None,
    intra_op_threads: int = 1,
) -> Registry:
    """Load every manifest under `root` (one folder per artifact); refuse bad ones, keep the rest.

    `available_providers` overrides what ONNX Runtime reports (tests use it to
    simulate hosts); `probe` overrides the batch `check_policy` runs on.
    """
    loader = _Loader(
        features, predictor_features, available_providers, probe or probe_batch(), intra_op_threads
    )
    manifests: dict[str, Manifest] = {}
    refused: dict[str, PolicyLoadError] = {}
    parsed: list[Manifest] = []
    for path in sorted(root.glob(f"*/{MANIFEST_FILE}")):
        try:
            parsed.append(load_manifest(path))
        except PolicyLoadError as exc:
            refused[exc.policy] = exc
    parsed.sort(key=lambda m: (m.kind is not ManifestKind.PREDICTOR, m.name))
    baselines = builtin_baselines() if include_baselines else ()
    policies: dict[str, Policy] = {}
    reserved = {str(b.name) for b in baselines} | {"throughput-greedy"}
    for m in parsed:
        try:
            if m.name in reserved:
                raise PolicyLoadError(m.name, "name is taken by a built-in baseline")
            loaded = loader.load(m)
        except PolicyLoadError as exc:
            refused[m.name] = exc
            continue
        manifests[m.name] = m
        if isinstance(loaded, OnnxPredictor):
            loader.predictors[m.name] = loaded
        else:
            policies[m.name] = loaded
    for name, error in refused.items():
        log.error("refused policy %s: %s", name, error.problem)
    if include_baselines:
        greedy = loader.predictors.get(DEFAULT_PREDICTOR)
        for b in builtin_baselines(greedy):
            policies[str(b.name)] = b
    summaries: dict[str, TrainingReference] = {}
    summaries_refused: dict[str, PolicyLoadError] = {}
    for name, m in manifests.items():
        try:
            if name in policies and (summary := load_summary(m.directory, features)) is not None:
                summaries[name] = with_manifest_families(summary, m)
        except PolicyLoadError as exc:
            summaries_refused[name] = exc
            log.error("refused training summary of %s: %s", name, exc.problem)
    return Registry(
        policies, dict(loader.predictors), manifests, refused, summaries, summaries_refused
    )


def with_manifest_families(summary: TrainingReference, manifest: Manifest) -> TrainingReference:
    """`summary` whose drift reference flags model families outside the manifest's
    ``training_data.model_families`` (docs/drift.md "Novelty"); unchanged when the
    manifest lists none. The summary file does not record families: the build does.
    """
    families = manifest.training_data.model_families
    reference = with_model_families(summary.reference, families)
    return dataclasses.replace(summary, reference=reference)
