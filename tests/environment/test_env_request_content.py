"""What the simulator's requests say about the workload and the host (issue 23, item 5).

Before: every request sent ``model_size_b = 0`` (below the smallest size any
shipped policy was trained on) and host CPU and memory always wholly free,
so ``cpu_free_fraction`` was 1 on every row — both outside `gavel-scorer`'s
training range (then synthetic clusters) on every request.
"""

from __future__ import annotations

import numpy as np

from service.contract import DEFAULT_FEATURES
from service.environment import simulated_episodes
from service.environment.samples import (
    _FAMILY_ASSUMPTIONS,
    HOST_USE_PER_DEVICE,
    family_model_size_b,
    host_free,
)
from service.policies import synthetic


def test_family_sizes_are_the_synthetic_training_sizes() -> None:
    # one documented size per family: the synthetic requests tests use and the
    # simulator (which every shipped policy is trained on) describe the same models
    assert {f: v[0] for f, v in _FAMILY_ASSUMPTIONS.items()} == synthetic._SIZE_B
    assert family_model_size_b("ResNet-50 (batch size 64)") == synthetic._SIZE_B["ResNet-50"]


def test_host_free_falls_with_the_devices_held() -> None:
    free = host_free(np.array([64.0, 64.0, 64.0]), np.array([8, 8, 0]), np.array([0.0, 8.0, 0.0]))
    np.testing.assert_allclose(free, [64.0, 64.0 * (1 - HOST_USE_PER_DEVICE), 64.0])


def test_simulated_requests_carry_sizes_and_varying_host_use() -> None:
    episodes = simulated_episodes("train", 1, range(2))
    requests = [r for group, _ in episodes for r in group]
    sizes = {r.workload.model_size_b for r in requests}
    assert min(sizes) > 0 and len(sizes) > 1
    names = DEFAULT_FEATURES.names
    rows = np.concatenate([DEFAULT_FEATURES(r.state, r.workload, r.options) for r in requests])
    cpu = rows[:, names.index("cpu_free_fraction")]
    memory = rows[:, names.index("memory_free_fraction")]
    for column in (cpu, memory):
        assert column.min() >= 1 - HOST_USE_PER_DEVICE - 1e-6
        assert np.mean(column < 1.0) > 0.5  # busy servers report less free host
    assert not np.any(rows[:, names.index("model_size")] == 0)
