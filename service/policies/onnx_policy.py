"""ONNX Runtime policies and predictors: the one module that imports onnxruntime.

Sessions are built once, at load, from bytes the registry has already checked
against the manifest's sha256. Execution providers come from the manifest in
order of preference; those this build of ONNX Runtime lacks are dropped with a
warning and CPU is always kept last, so a manifest that asks for CUDA still
loads on a CPU-only host — and `OnnxModel.provider` says where it really runs.

ONNX Runtime raises its own exception classes (pybind11 types that derive
only from `Exception`); they are translated here, at the boundary, into
`PolicyLoadError` (session creation) and `PolicyScoringError` (``run``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from service.contract import MirrorRequest
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.errors import PolicyLoadError, PolicyScoringError
from service.policies.manifest import Manifest, TensorSpec
from service.policies.predictor import THROUGHPUT_NAMES, Predictor, with_completion_time
from service.policies.predictor_features import PREDICTOR_FEATURES
from service.policies.probabilities import ProbabilityRule, decide_from_scores

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
_ORT_ERRORS: tuple[type[BaseException], ...] = (
    *(
        c
        for c in (
            getattr(_ort_state, n, None)
            for n in (
                "Fail",
                "InvalidArgument",
                "NoSuchFile",
                "NoModel",
                "EngineError",
                "RuntimeException",
                "InvalidProtobuf",
                "ModelLoaded",
                "NotImplemented",
                "InvalidGraph",
                "EPFail",
            )
        )
        if isinstance(c, type) and issubclass(c, BaseException)
    ),
    RuntimeError,
    ValueError,
)
_ROW_KEY = np.random.default_rng(0).uniform(1.0, 2.0, 256)
"""Projection for `distinct_rows`: full-mantissa weights, so distinct rows rarely collide."""
SUPPORT_OUTPUT = "out_of_support"
"""A predictor's optional second output, and its prediction name: 1.0 outside training support."""
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64"}


def resolve_providers(
    requested: Sequence[str], available: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(providers to pass to ONNX Runtime, requested ones that are missing).

    Keeps the manifest's order, drops what is not available, always ends with CPU.
    """
    use = [p for p in requested if p in available]
    missing = [p for p in requested if p not in available]
    if CPU not in use:
        use.append(CPU)
    return use, missing


def _dims_match(spec: int | str, actual: object) -> bool:
    """A named manifest dim matches a symbolic/unknown model dim; numbers must be equal."""
    if isinstance(spec, str):
        return actual is None or isinstance(actual, str)
    return isinstance(actual, int) and actual == spec


def distinct_rows(x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """``(unique, inverse)`` with ``unique[inverse] == x``, found through a 1-D row key.

    Options on the same class at the same scale share a predictor row (a 16 x 50
    batch has ~60 distinct rows of 800) and tree ensembles cost per row, so each
    distinct row is scored once. ``np.unique(axis=0)`` costs more than it saves;
    a random projection is cheap, and the result is verified exactly, so a key
    collision only falls back to scoring every row.
    """
    width = x.shape[1]
    weights = _ROW_KEY[:width] if width <= len(_ROW_KEY) else np.random.default_rng(0).random(width)
    _, first, inverse = np.unique(x @ weights, return_index=True, return_inverse=True)
    unique = x[first]
    if not np.array_equal(unique[inverse], x):
        return x, np.arange(len(x), dtype=np.int64)
    return unique, inverse.astype(np.int64).reshape(-1)


class OnnxModel:
    """One ONNX Runtime session, checked against its manifest's tensor specs."""

    def __init__(
        self,
        manifest: Manifest,
        model_bytes: bytes,
        *,
        available_providers: Sequence[str] | None = None,
        intra_op_threads: int = 1,
    ) -> None:
        self.manifest = manifest
        available = (
            ort.get_available_providers() if available_providers is None else available_providers
        )
        use, self.missing_providers = resolve_providers(manifest.execution_providers, available)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(model_bytes, options, providers=use)
        except _ORT_ERRORS as exc:
            raise PolicyLoadError(
                manifest.name, f"cannot load model `{manifest.model_file}`: {exc}"
            ) from exc
        self._check_io("inputs", manifest.inputs, self._session.get_inputs())
        self._check_io("outputs", manifest.outputs, self._session.get_outputs())
        self._input = manifest.inputs[0].name
        self._outputs = [t.name for t in manifest.outputs]
        if self.provider != manifest.execution_providers[0]:
            log.warning(
                "policy %s: asked for %s, running on %s (available here: %s)",
                manifest.name,
                list(manifest.execution_providers),
                self.provider,
                list(available),
            )

    @property
    def provider(self) -> str:
        """The execution provider the session actually runs on."""
        return str(self._session.get_providers()[0])

    def _check_io(self, which: str, specs: Sequence[TensorSpec], actual: Sequence[object]) -> None:
        name = self.manifest.name
        got = [getattr(a, "name", "") for a in actual]
        if got != [s.name for s in specs]:
            raise PolicyLoadError(
                name,
                f"`{which}` names are {[s.name for s in specs]} in the manifest,"
                f" {got} in the model",
            )
        for i, (spec, arg) in enumerate(zip(specs, actual, strict=True)):
            dtype = _ORT_DTYPES.get(str(getattr(arg, "type", "")), str(getattr(arg, "type", "")))
            if dtype != spec.dtype:
                raise PolicyLoadError(
                    name,
                    f"`{which}[{i}].dtype` is {spec.dtype} in the manifest, {dtype} in the model",
                )
            shape = list(getattr(arg, "shape", []))
            if len(shape) != len(spec.shape) or not all(
                _dims_match(s, a) for s, a in zip(spec.shape, shape, strict=True)
            ):
                raise PolicyLoadError(
                    name,
                    f"`{which}[{i}].shape` is {list(spec.shape)} in the manifest,"
                    f" {shape} in the model",
                )

    def run(self, x: NDArray[np.float32]) -> list[NDArray[np.float32]]:
        """All outputs for input rows `x`; ORT failures become `PolicyScoringError`."""
        try:
            out = self._session.run(self._outputs, {self._input: np.ascontiguousarray(x)})
        except _ORT_ERRORS as exc:
            raise PolicyScoringError(self.manifest.name, f"ONNX Runtime failed: {exc}") from exc
        return [np.asarray(o, dtype=np.float32) for o in out]


class OnnxPredictor:
    """A throughput-quantile predictor over the rows of its feature function.

    `features` is `PREDICTOR_FEATURES` for the Gavel predictor; the outcome
    predictor learned from simulated logs uses `OUTCOME_FEATURES`.
    """

    def __init__(
        self,
        model: OnnxModel,
        features: Callable[[Sequence[MirrorRequest]], NDArray[np.float32]] = PREDICTOR_FEATURES,
    ) -> None:
        self._model = model
        self._features = features
        self._last: tuple[weakref.ref[ScoringBatch], dict[str, NDArray[np.float32]]] | None = None

    @property
    def name(self) -> str:
        """Registry name."""
        return self._model.manifest.name

    @property
    def version(self) -> str:
        """Artifact version."""
        return self._model.manifest.version

    @property
    def provider(self) -> str:
        """Execution provider actually used."""
        return self._model.provider

    @property
    def model(self) -> OnnxModel:
        """The underlying session wrapper."""
        return self._model

    @property
    def features(self) -> Callable[[Sequence[MirrorRequest]], NDArray[np.float32]]:
        """The feature function its rows come from."""
        return self._features

    def throughput(self, batch: ScoringBatch) -> NDArray[np.float32]:
        """Throughput quantiles ``(n_options_total, 3)`` of `batch`, from `predict`'s per-batch
        result: a planner sharing this predictor pays its features and ONNX run once."""
        p = self.predict(batch)
        return np.stack([p[name] for name in THROUGHPUT_NAMES], axis=1)

    @property
    def flags_support(self) -> bool:
        """Whether the model has the ``out_of_support`` output (built with a training support)."""
        return [t.name for t in self._model.manifest.outputs[1:2]] == [SUPPORT_OUTPUT]

    def predict_rows(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """Throughput quantiles ``(n, 3)`` for predictor rows `x`; checked finite, > 0, ordered."""
        return self.predict_rows_flagged(x)[0]

    def predict_rows_flagged(
        self, x: NDArray[np.float32]
    ) -> tuple[NDArray[np.float32], NDArray[np.float32] | None]:
        """`predict_rows` and the ``out_of_support`` flag per row (None if the model has none).

        Outside its training support a model built with one answers the widest
        interval it gave in training and says so (1.0):
        `service.learning.build_models.support`.
        """
        if len(x) == 0:
            return np.zeros((0, 3), dtype=np.float32), (
                np.zeros(0, dtype=np.float32) if self.flags_support else None
            )
        unique, inverse = distinct_rows(x.astype(np.float32, copy=False))
        outs = self._model.run(unique)
        q = outs[0].reshape(len(unique), 3)[inverse]
        flag = outs[1].reshape(len(unique))[inverse] if self.flags_support else None
        if not np.isfinite(q).all() or (q <= 0).any():
            row = int(np.flatnonzero(~(np.isfinite(q) & (q > 0)).all(axis=1))[0])
            raise PolicyScoringError(self.name, f"prediction for row {row} is {q[row].tolist()}")
        if (np.diff(q, axis=1) < 0).any():
            raise PolicyScoringError(self.name, "quantiles are not ordered q10 <= q50 <= q90")
        return q, flag

    def predict(self, batch: ScoringBatch) -> dict[str, NDArray[np.float32]]:
        """Throughput and completion-time quantiles per option row.

        Several policies of one micro-batch share a predictor (a scorer that
        attaches its predictions, a baseline that ranks by them), so the result
        for the latest batch is kept and handed out again, read-only: the
        predictor's features and ONNX run are paid once per batch, not once
        per policy. A batch is immutable, and the cache holds it weakly.
        """
        last = self._last
        if last is not None and last[0]() is batch:
            return dict(last[1])
        x = self._features(batch.requests)
        if len(x) != len(batch.mask):
            raise PolicyScoringError(
                self.name,
                f"`batch.requests` describe {len(x)} options, the batch has {len(batch.mask)} rows",
            )
        q, flag = self.predict_rows_flagged(x)
        predictions = with_completion_time(batch, q)
        if flag is not None:
            predictions[SUPPORT_OUTPUT] = flag.astype(np.float32)
        for values in predictions.values():
            values.flags.writeable = False
        self._last = (weakref.ref(batch), predictions)
        return dict(predictions)


class OnnxPolicy:
    """A scoring policy: ONNX scores over contract feature rows, then its probability rule."""

    def __init__(
        self, model: OnnxModel, rule: ProbabilityRule, predictor: Predictor | None = None
    ) -> None:
        self._model = model
        self._rule = rule
        self._predictor = predictor

    @property
    def name(self) -> str:
        """Registry name."""
        return self._model.manifest.name

    @property
    def version(self) -> str:
        """Artifact version."""
        return self._model.manifest.version

    @property
    def provider(self) -> str:
        """Execution provider actually used."""
        return self._model.provider

    @property
    def rule(self) -> ProbabilityRule:
        """How this policy's scores become probabilities."""
        return self._rule

    @property
    def model(self) -> OnnxModel:
        """The underlying session wrapper."""
        return self._model

    def scores(self, features: NDArray[np.float32]) -> NDArray[np.float32]:
        """Raw scores, shape ``(n,)``; any non-finite output is a `PolicyScoringError`."""
        if len(features) == 0:
            return np.zeros(0, dtype=np.float32)
        s = self._model.run(features)[0].reshape(-1)
        if s.shape != (len(features),):
            raise PolicyScoringError(self.name, f"expected {len(features)} scores, got {s.shape}")
        bad = np.flatnonzero(~np.isfinite(s))
        if len(bad):
            raise PolicyScoringError(self.name, f"score of row {int(bad[0])} is {s[bad[0]]}")
        return s

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Score, mask, apply the rule, attach the predictor's predictions if any."""
        scores = self.scores(batch.features)
        predictions = self._predictor.predict(batch) if self._predictor is not None else None
        return decide_from_scores(self.name, scores, batch, self._rule, rng, predictions)
