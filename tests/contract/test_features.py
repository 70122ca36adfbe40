"""The feature function: shape, finiteness, identity (version + hash)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np

from service.contract import (
    DEFAULT_FEATURES,
    FEATURE_NAMES,
    N_FEATURES,
    FeatureConstants,
    FeatureFunction,
    MirrorRequest,
)
from service.contract import features as features_module


def test_features_are_float32_finite_one_row_per_option(
    requests_sample: list[MirrorRequest],
) -> None:
    for r in requests_sample:
        x = DEFAULT_FEATURES(r.state, r.workload, r.options)
        assert (
            x.shape
            == (r.options.n_options, N_FEATURES)
            == (r.options.n_options, len(FEATURE_NAMES))
        )
        assert x.dtype == np.float32
        assert np.isfinite(x).all()


def test_features_follow_the_data(requests_sample: list[MirrorRequest]) -> None:
    """Columns mean what the docstring says: checked against the raw state."""
    r = requests_sample[0]
    x = DEFAULT_FEATURES(r.state, r.workload, r.options)
    nodes = r.options.node_index
    mem = np.array([r.state.hardware_of(n).accelerator_memory_gb for n in nodes])
    col = FEATURE_NAMES.index
    np.testing.assert_allclose(x[:, col("accel_memory")], mem / 80.0, rtol=1e-6)
    np.testing.assert_allclose(x[:, col("utilisation")], r.state.utilisation[nodes], rtol=1e-6)
    unavailable = r.state.draining[nodes] | ~r.state.healthy[nodes]
    np.testing.assert_array_equal(x[:, col("unavailable")], unavailable)


def test_changing_one_constant_changes_the_hash() -> None:
    base = DEFAULT_FEATURES.definition_hash
    assert FeatureFunction().definition_hash == base, "the hash must be deterministic"
    for field in dataclasses.fields(FeatureConstants):
        changed = dataclasses.replace(
            FeatureConstants(), **{field.name: getattr(FeatureConstants(), field.name) + 1.0}
        )
        assert FeatureFunction(constants=changed).definition_hash != base, field.name


def test_editing_the_computation_changes_the_hash(tmp_path: Path) -> None:
    """A copy of the module with one literal edited in the computation hashes differently."""
    source = Path(features_module.__file__).read_text()
    edited = source.replace(
        "out[:, 22] = np.log2(1.0 + workload.accelerators)",
        "out[:, 22] = np.log2(2.0 + workload.accelerators)",
    )
    assert edited != source
    path = tmp_path / "features_edited.py"
    path.write_text(edited)
    spec = importlib.util.spec_from_file_location("features_edited", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["features_edited"] = module
    try:
        spec.loader.exec_module(module)
        assert module.FeatureFunction().definition_hash != DEFAULT_FEATURES.definition_hash
    finally:
        del sys.modules["features_edited"]
