"""Compare a rebuilt model artifact with the committed one by behaviour, never by bytes.

Why not sha256: a float model build is bit-reproducible only on the CPU it was
made on. The committed ``gavel-scorer`` (an MLP trained with Adam on BLAS
matrix products) rebuilt with OpenBLAS's AVX2 kernels
(``OPENBLAS_CORETYPE=Haswell``) instead of this machine's AVX-512 ones has
other bytes (sha256 ``235656c9…``, the exact file issue 19's busy CI machine
built), and still the same behaviour to within a small, stated tolerance.
So a rebuild "reproduces" the committed artifact when

- its manifest declares the same thing: every field but the model file's
  sha256 and the fit figures (``evaluation``) is equal;
- its fit figures are within the tolerance the model kind allows
  (`figures_within`);
- it predicts, scores and chooses like the committed one on a fixed input
  set that neither build trained on (the callers' tests).

Not a conftest: imported explicitly by tests/policies and tests/learning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.policies.base import ScoringBatch
from service.policies.manifest import Manifest
from service.policies.probabilities import first_argmax

FIDELITY_BOUND = 1e-4
"""ONNX vs the in-memory model, as the builds themselves require: a bound, not a value."""


def declared(manifest: Manifest) -> dict[str, Any]:
    """The manifest as a dict without the model's sha256 and the fit figures."""
    d = manifest.to_dict()
    d["model"] = {k: v for k, v in d["model"].items() if k != "sha256"}
    d.pop("evaluation")
    return d


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= _flat(value, f"{path}.")
        else:
            out[path] = value
    return out


def figures_within(
    built: Mapping[str, Any],
    committed: Mapping[str, Any],
    *,
    rel: float,
    wider: Mapping[str, float] | None = None,
) -> list[str]:
    """Where two manifests' ``evaluation`` figures differ by more than allowed (empty: none).

    Numbers must agree within `rel` (relative, with an absolute floor of `rel`
    for figures near 0), or within ``wider[key]`` (absolute) for the keys a
    model kind lets move more; ``onnx_vs_sklearn*`` figures need only stay
    under `FIDELITY_BOUND`; everything else (counts' lists, names, strings)
    must be equal.
    """
    a, b = _flat(built), _flat(committed)
    problems = [f"{k}: only in one manifest" for k in sorted(set(a) ^ set(b))]
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if "onnx_vs_sklearn" in key:
            if not (isinstance(x, int | float) and x <= FIDELITY_BOUND):
                problems.append(f"{key}: {x!r} is not <= {FIDELITY_BOUND}")
        elif isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(x, bool):
            allowed = (wider or {}).get(key)
            ok = (
                abs(x - y) <= allowed
                if allowed is not None
                else math.isclose(x, y, rel_tol=rel, abs_tol=rel)
            )
            if not ok:
                problems.append(f"{key}: {x!r} vs committed {y!r}")
        elif x != y:
            problems.append(f"{key}: {x!r} vs committed {y!r}")
    return problems


def scorer_agreement(
    built: NDArray[np.floating[Any]], committed: NDArray[np.floating[Any]], batch: ScoringBatch
) -> dict[str, float]:
    """How alike two scorers' scores on `batch` are: the figures the tests bound.

    ``corr``: Pearson correlation of the option scores; ``mean_abs_diff_sd``:
    mean absolute difference in units of the committed scores' standard
    deviation; ``same_choice``: share of requests with a feasible option where
    both pick the same best feasible option.
    """
    a, b = built.astype(np.float64), committed.astype(np.float64)
    pick_a = first_argmax(a, batch.offsets, batch.mask)
    pick_b = first_argmax(b, batch.offsets, batch.mask)
    has = pick_b >= 0
    return {
        "corr": float(np.corrcoef(a, b)[0, 1]),
        "mean_abs_diff_sd": float(np.mean(np.abs(a - b)) / np.std(b)),
        "same_choice": float(np.mean(pick_a[has] == pick_b[has])),
    }
