"""Features of the outcome predictor learned from simulated logs (`service.learning`).

The Gavel predictor's rows (`predictor_features`) say *which job on which
hardware at what scale*; that is all an isolated measurement depends on. A
placement's realised throughput also depends on *where it lands now*: a
single-GPU job put on a server with no idle GPU shares one, and a job that
lands on a busy server or in a busy cluster is more likely to get a
co-tenant later. So this function appends four columns computed from the
same contract request. Like the other feature functions it carries a version
and a definition hash (which covers the Gavel function's hash too), and the
registry refuses a model built on another definition.

====  =====================  ==================================================
col   name                   definition
====  =====================  ==================================================
0-17  (predictor features)   `PREDICTOR_FEATURES`, unchanged; 14-17 are the
                             gang's shape (log2 nodes, log2 fewest / most
                             accelerators on one node, crosses a locality)
18    share_fraction         GPUs the option takes beyond the idle ones on its
                             nodes / GPUs taken (0 = no sharing, 1 = all shared)
19    option_utilisation     mean utilisation of the option's nodes
20    cluster_utilisation    busy / total accelerators over the whole cluster
21    log10_work_units       log10(1 + work units); 0 when not given
====  =====================  ==================================================

Idle accelerators per node are ``round(total * (1 - utilisation))``, as the
contract defines utilisation (busy / total).

Open vocabularies (contract v2): no column reads the workload kind or QoS
class, so an unknown one changes nothing here; capability numbers a class
leaves unknown (None) reach these rows only through the Gavel columns, which
impute them (`service.contract.imputation`), so a row is never NaN
(tests/policies/test_unknown_capabilities.py).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest
from service.policies.predictor_features import (
    PREDICTOR_FEATURE_NAMES,
    PREDICTOR_FEATURES,
    BatchLayout,
    LastBatchRows,
)

OUTCOME_FEATURE_VERSION = "placement-outcome-features-v2"
OUTCOME_FEATURE_NAMES: tuple[str, ...] = (
    *PREDICTOR_FEATURE_NAMES,
    "share_fraction",
    "option_utilisation",
    "cluster_utilisation",
    "log10_work_units",
)
N_OUTCOME_FEATURES = len(OUTCOME_FEATURE_NAMES)


def placement_columns(request: MirrorRequest) -> NDArray[np.float64]:
    """Columns 18-21 for every option of `request`, shape ``(n_options, 4)``."""
    state, options = request.state, request.options
    n_opt = options.n_options
    total = state.accelerators_total.astype(np.float64)
    util = state.utilisation.astype(np.float64)
    idle = np.rint(total * (1.0 - util))
    nodes = options.node_index
    take = options.accelerators.astype(np.float64)
    shared = np.maximum(take - idle[nodes], 0.0)

    def per_option(values: NDArray[np.float64]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = np.bincount(
            options.entry_option, weights=values, minlength=n_opt
        ).astype(np.float64)
        return out

    taken = per_option(take)
    out = np.zeros((n_opt, 4))
    out[:, 0] = per_option(shared) / np.maximum(taken, 1.0)
    out[:, 1] = per_option(util[nodes]) / np.maximum(options.nodes_per_option, 1)
    out[:, 2] = float((total * util).sum() / max(total.sum(), 1.0))
    work = request.workload.work_units
    out[:, 3] = math.log10(1.0 + work) if work is not None and work > 0 else 0.0
    return out


def batch_placement_columns(requests: Sequence[MirrorRequest]) -> NDArray[np.float64]:
    """`placement_columns` of every request, stacked, in one numpy pass over the batch.

    Bit for bit the per-request columns (tests/policies/test_batch_equivalence.py):
    per-option sums run over each option's entries in entry order in both
    forms, elementwise operations do not depend on their neighbours, and the
    cluster-wide utilisation is summed per request over a contiguous slice
    that holds exactly that request's nodes, as the per-request form sums
    its own array.
    """
    if not requests:
        return np.zeros((0, 4))
    layout = BatchLayout.of(requests)
    total = np.concatenate([r.state.accelerators_total for r in requests], dtype=np.float64)
    util = np.concatenate([r.state.utilisation for r in requests], dtype=np.float64)
    idle = np.rint(total * (1.0 - util))
    nodes, take = layout.nodes, layout.accelerators
    shared = np.maximum(take - idle[nodes], 0.0)
    busy = total * util
    bounds = [*layout.node_base.tolist(), len(total)]
    cluster = np.empty(len(requests))
    work = np.empty(len(requests))
    for r, request in enumerate(requests):
        lo, hi = bounds[r], bounds[r + 1]
        cluster[r] = float(busy[lo:hi].sum() / max(total[lo:hi].sum(), 1.0))
        units = request.workload.work_units
        work[r] = math.log10(1.0 + units) if units is not None and units > 0 else 0.0
    out = np.zeros((layout.n_options_total, 4))
    out[:, 0] = layout.per_option(shared) / np.maximum(layout.per_option(take), 1.0)
    out[:, 1] = layout.per_option(util[nodes]) / np.maximum(layout.nodes_per_option, 1)
    out[:, 2] = np.repeat(cluster, layout.n_options)
    out[:, 3] = np.repeat(work, layout.n_options)
    return out


def _outcome_rows(requests: Sequence[MirrorRequest]) -> NDArray[np.float32]:
    """The Gavel rows (shared with the Gavel predictor in a batch) and the placement columns."""
    if not requests:
        return np.zeros((0, N_OUTCOME_FEATURES), dtype=np.float32)
    gavel = PREDICTOR_FEATURES(requests)
    extra = batch_placement_columns(requests)
    return np.concatenate([gavel, extra.astype(np.float32)], axis=1)


@dataclass(frozen=True)
class OutcomeFeatureFunction:
    """The outcome predictor's feature function with its identity (version + hash)."""

    version: str = OUTCOME_FEATURE_VERSION
    names: tuple[str, ...] = OUTCOME_FEATURE_NAMES
    _memo: LastBatchRows = field(
        default_factory=LastBatchRows, init=False, repr=False, compare=False
    )

    def __call__(self, requests: Sequence[MirrorRequest]) -> NDArray[np.float32]:
        """Rows for every option of every request, concatenated in batch order.

        Read-only when `requests` is a tuple (a scorer batch): see `LastBatchRows`.
        """
        return self._memo.rows(requests, _outcome_rows)

    @property
    def definition_hash(self) -> str:
        """sha256 over version, names, the Gavel function's hash and this module's source."""
        material = json.dumps(
            {
                "version": self.version,
                "names": list(self.names),
                "gavel": PREDICTOR_FEATURES.definition_hash,
                "source": inspect.getsource(placement_columns),
            },
            sort_keys=True,
        )
        return hashlib.sha256(material.encode()).hexdigest()


OUTCOME_FEATURES = OutcomeFeatureFunction()
