"""The fast decode and validation give exactly what the straightforward versions gave.

Ingest decodes and validates every mirrored request; issue 14 made both cheaper
(no per-node loop for the common one-label-per-node shape; the per-node column
rules asked all at once, with the rule-by-rule search only for a request that
fails them; one reduction per options rule before any mask is built). The
scorer reuses the decoded object and the decision log depends on it, and a
refusal must keep naming the same field with the same message. So the previous
implementation is kept as the oracle (`decode_reference`, the same computation),
and both are run over valid requests of several shapes and over thousands of
seeded mutations of them: each time they must both accept with equal objects (same dtypes, same
values bit for bit, same read-only flags) or both refuse with the same error
class, field and message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from service.contract import MirrorRequest, RequestLimits
from service.policies.synthetic import random_requests
from service.transport.http.convert import mirror_from_json, mirror_to_json
from service.wire.convert import mirror_request_to_pb
from tests.contract.decode_reference import (
    Proto,
    assert_same_request,
    assert_same_state,
    current,
    ref_state,
    reference,
)

# --------------------------------------------------------------------------- inputs


def _base_messages() -> list[Proto]:
    """Valid requests of several sizes and label layouts."""
    out: list[Proto] = []
    for seed, nodes, options in ((1, 1, 1), (2, 7, 5), (3, 32, 24), (4, 128, 50)):
        for r in random_requests(seed=seed, n_requests=3, n_nodes=nodes, max_options=options):
            out.append(mirror_request_to_pb(r))
    no_labels = Proto()
    no_labels.CopyFrom(out[-1])
    del no_labels.state.labels[:], no_labels.state.label_offsets[:]
    mixed = Proto()
    mixed.CopyFrom(out[-1])
    n = len(mixed.state.node_ids)
    del mixed.state.labels[:], mixed.state.label_offsets[:]
    offsets = [0]
    for i in range(n):  # 0, 1, 2 or 3 labels per node, some shared, some repeated
        for k in range(i % 4):
            mixed.state.labels.append(f"k{k}=v{(i * k) % 3}")
        offsets.append(len(mixed.state.labels))
    mixed.state.label_offsets.extend(offsets)
    distinct = Proto()
    distinct.CopyFrom(out[-1])
    for i in range(n):
        distinct.state.labels[i] = f"rack=r{i % 5}"
    return [*out, no_labels, mixed, distinct]


_NUMBERS = (
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    -0.0,
    0.0,
    0.5,
    1.0,
    1.5,
    1e12,
    3.4e38,
    2.0**31 - 1,
    2.0**31,
)
_INTS = (-(2**31), -1, 0, 1, 2, 3, 7, 127, 128, 2**31 - 1)
_UINTS = (0, 1, 2, 3, 127, 128, 2**31 - 1, 2**31, 2**32 - 1)

Mutation = Callable[[Proto, np.random.Generator], None]


def _set_number(column: str) -> Mutation:
    def mutate(m: Proto, rng: np.random.Generator) -> None:
        values = getattr(m.state, column)
        if len(values):
            values[int(rng.integers(len(values)))] = float(rng.choice(_NUMBERS))

    return mutate


def _set_int(parent: str, column: str, choices: Sequence[int]) -> Mutation:
    def mutate(m: Proto, rng: np.random.Generator) -> None:
        values = getattr(getattr(m, parent), column)
        if len(values):
            values[int(rng.integers(len(values)))] = int(rng.choice(choices))

    return mutate


def _resize(parent: str, column: str) -> Mutation:
    def mutate(m: Proto, rng: np.random.Generator) -> None:
        values = getattr(getattr(m, parent), column)
        if len(values) and rng.random() < 0.5:
            del values[int(rng.integers(len(values)))]
        elif len(values):
            values.append(values[0])

    return mutate


def _flip_bool(column: str) -> Mutation:
    def mutate(m: Proto, rng: np.random.Generator) -> None:
        values = getattr(m.state, column)
        if len(values):
            i = int(rng.integers(len(values)))
            values[i] = not values[i]

    return mutate


def _node_id(m: Proto, rng: np.random.Generator) -> None:
    ids = m.state.node_ids
    if not len(ids):
        return
    i = int(rng.integers(len(ids)))
    ids[i] = str(rng.choice(["", ids[0], ids[-1], "fresh"]))


def _label_offsets(m: Proto, rng: np.random.Generator) -> None:
    offsets = m.state.label_offsets
    if not len(offsets):
        m.state.labels.append("orphan=1")
        return
    i = int(rng.integers(len(offsets)))
    offsets[i] = int(rng.choice(_UINTS[:6])) if rng.random() < 0.7 else offsets[i] + 1


def _labels(m: Proto, rng: np.random.Generator) -> None:
    labels = m.state.labels
    if len(labels) and rng.random() < 0.5:
        labels[int(rng.integers(len(labels)))] = str(rng.choice(["", "a=b", labels[0]]))
    else:
        labels.append("extra=1")


def _hardware(m: Proto, rng: np.random.Generator) -> None:
    if not len(m.state.hardware):
        return
    hw = m.state.hardware[int(rng.integers(len(m.state.hardware)))]
    name = str(
        rng.choice(["accelerator_memory_gb", "peak_dense_tflops", "memory_bandwidth_gbps", "name"])
    )
    if name == "name":
        hw.name = str(rng.choice(["", " ", "NEW"]))
    else:
        setattr(hw, name, float(rng.choice(_NUMBERS)))


def _drop_hardware(m: Proto, rng: np.random.Generator) -> None:
    if not len(m.state.hardware):
        return
    del m.state.hardware[int(rng.integers(len(m.state.hardware))) :]


def _offsets(m: Proto, rng: np.random.Generator) -> None:
    offsets = m.options.node_offsets
    if not len(offsets):
        return
    i = int(rng.integers(len(offsets)))
    offsets[i] = int(rng.choice([-1, 0, 1, offsets[i] - 1, offsets[i] + 1, 2000, 10**6]))


def _wide_option(m: Proto, rng: np.random.Generator) -> None:
    """One option over more nodes than `LIMITS` allows (gang jobs are rarely that wide)."""
    n = len(m.state.node_ids)
    width = min(n, int(rng.integers(1, 8)))
    del m.options.node_offsets[:], m.options.node_index[:], m.options.accelerators[:]
    del m.options.option_ids[:]
    m.options.node_offsets.extend([0, width])
    m.options.node_index.extend(range(width))
    m.options.accelerators.extend([1] * width)
    m.production.option = 0


def _empty_options(m: Proto, rng: np.random.Generator) -> None:
    del m.options.node_offsets[:]
    if rng.random() < 0.5:
        m.options.node_offsets.append(0)
        del m.options.node_index[:], m.options.accelerators[:]


MUTATIONS: dict[str, Mutation] = {
    **{
        f"number {c}": _set_number(c)
        for c in ("cpu_free", "cpu_total", "memory_free_gb", "memory_total_gb", "utilisation")
    },
    **{
        f"int {c}": _set_int("state", c, _INTS)
        for c in ("accelerators_free", "accelerators_total", "queue_length")
    },
    "node_hardware": _set_int("state", "node_hardware", _UINTS),
    **{
        f"resize state.{c}": _resize("state", c)
        for c in (
            "node_ids",
            "node_hardware",
            "accelerators_free",
            "accelerators_total",
            "cpu_free",
            "cpu_total",
            "memory_free_gb",
            "memory_total_gb",
            "utilisation",
            "queue_length",
            "healthy",
            "draining",
            "zone",
            "locality",
            "label_offsets",
            "labels",
        )
    },
    "healthy": _flip_bool("healthy"),
    "draining": _flip_bool("draining"),
    "node id": _node_id,
    "label offsets": _label_offsets,
    "labels": _labels,
    "hardware": _hardware,
    "drop hardware": _drop_hardware,
    "option offsets": _offsets,
    "option node_index": _set_int("options", "node_index", _INTS),
    "option accelerators": _set_int("options", "accelerators", _INTS),
    **{
        f"resize options.{c}": _resize("options", c)
        for c in ("node_offsets", "node_index", "accelerators", "option_ids")
    },
    "empty options": _empty_options,
    "wide option": _wide_option,
}


# --------------------------------------------------------------------------- tests

LIMITS = RequestLimits(max_nodes_per_option=4)  # small enough that big options trip it


def test_valid_requests_decode_to_the_same_objects() -> None:
    for msg in _base_messages():
        want = reference(msg, RequestLimits())
        assert isinstance(want, MirrorRequest), want
        assert_same_request(current(msg, RequestLimits()), want)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_mutated_requests_are_refused_or_accepted_exactly_as_before(name: str) -> None:
    rng = np.random.default_rng(sorted(MUTATIONS).index(name))
    bases = _base_messages()
    for trial in range(60):
        msg = Proto()
        msg.CopyFrom(bases[trial % len(bases)])
        for _ in range(1 + trial % 3):  # one, two or three mutations of this kind
            MUTATIONS[name](msg, rng)
        want = reference(msg, LIMITS)
        assert_same_request(current(msg, LIMITS), want)


RULES_REACHED = {
    "`options.accelerators[#]` must be >= #",
    "`options.accelerators` must have one count per node entry",
    "`options.node_index[#]` must index state nodes (< #)",
    "`options.node_offsets` must start at # and end at len(node_index)",
    "`options.option_ids` must be empty or one per option (#)",
    "`options[#]` must place on at least one node",
    "`options` must list at least one placement option",
    "`state.accelerators_free[#]` must be <= state.accelerators_total[#]",
    "`state.accelerators_free[#]` must be >= #",
    "`state.accelerators_free` must have one value per node (#)",
    "`state.accelerators_total[#]` must be >= #",
    "`state.accelerators_total` must have one value per node (#)",
    "`state.cpu_free[#]` must be <= state.cpu_total[#]",
    "`state.cpu_free[#]` must be >= #",
    "`state.cpu_free[#]` must be finite",
    "`state.cpu_free` must have one value per node (#)",
    "`state.cpu_total[#]` must be >= #",
    "`state.cpu_total[#]` must be finite",
    "`state.cpu_total` must have one value per node (#)",
    "`state.draining` must have one value per node (#)",
    "`state.hardware[#].accelerator_memory_gb` must be >= #",
    "`state.hardware[#].accelerator_memory_gb` must be at most #e+#",
    "`state.hardware[#].accelerator_memory_gb` must be finite",
    "`state.hardware[#].memory_bandwidth_gbps` must be >= #",
    "`state.hardware[#].memory_bandwidth_gbps` must be at most #e+#",
    "`state.hardware[#].memory_bandwidth_gbps` must be finite",
    "`state.hardware[#].name` must be a non-empty string",
    "`state.hardware[#].peak_dense_tflops` must be >= #",
    "`state.hardware[#].peak_dense_tflops` must be at most #e+#",
    "`state.hardware[#].peak_dense_tflops` must be finite",
    "`state.hardware` must describe at least one hardware class",
    "`state.healthy` must have one value per node (#)",
    "`state.label_offsets` must be non-decreasing",
    "`state.label_offsets` must be set when labels are given",
    "`state.label_offsets` must have n_nodes + # (#) entries from # to len(labels)",
    "`state.locality` must have one entry per node (#)",
    "`state.memory_free_gb[#]` must be <= state.memory_total_gb[#]",
    "`state.memory_free_gb[#]` must be >= #",
    "`state.memory_free_gb[#]` must be finite",
    "`state.memory_free_gb` must have one value per node (#)",
    "`state.memory_total_gb[#]` must be >= #",
    "`state.memory_total_gb[#]` must be finite",
    "`state.memory_total_gb` must have one value per node (#)",
    "`state.node_hardware[#]` must index state.hardware (< #)",
    "`state.node_hardware` must have one value per node (#)",
    "`state.node_ids[#]` duplicates node id ''",
    "`state.node_ids[#]` duplicates node id 'fresh'",
    "`state.node_ids[#]` duplicates node id 'node-#'",
    "`state.node_ids[#]` must be a non-empty string",
    "`state.queue_length[#]` must be >= #",
    "`state.queue_length` must have one value per node (#)",
    "`state.utilisation[#]` must be <= #",
    "`state.utilisation[#]` must be >= #",
    "`state.utilisation[#]` must be finite",
    "`state.utilisation` must have one value per node (#)",
    "`state.zone` must have one entry per node (#)",
    "`options[#]` spans more than # nodes",
}


def _rule(message: str) -> str:
    """The rule a refusal message states, without indices and values."""
    return re.split(r",? got ", re.sub(r"\d+", "#", message))[0]


def test_the_mutations_reach_every_rule() -> None:
    """The comparison above means something: the mutated requests trip each rule."""
    bases = _base_messages()
    refused: set[str] = set()
    accepted = 0
    for index, name in enumerate(sorted(MUTATIONS)):
        rng = np.random.default_rng(index)
        for trial in range(60):
            msg = Proto()
            msg.CopyFrom(bases[trial % len(bases)])
            for _ in range(1 + trial % 3):
                MUTATIONS[name](msg, rng)
            outcome = reference(msg, LIMITS)
            if isinstance(outcome, tuple):
                refused.add(_rule(outcome[2]))
            else:
                accepted += 1
    assert accepted >= 100
    assert refused >= RULES_REACHED, sorted(RULES_REACHED - refused)


def test_http_json_decodes_to_the_same_state() -> None:
    """The HTTP model goes through the same `state_from_columns` (plain lists there)."""
    from service.transport.http.models import MirrorRequestModel

    for seed, nodes in ((5, 3), (6, 64)):
        for r in random_requests(seed=seed, n_requests=2, n_nodes=nodes, max_options=10):
            body = mirror_to_json(r)
            got, _ = mirror_from_json(body)
            want = ref_state(MirrorRequestModel.model_validate_json(body).state)
            assert_same_state(got.state, want)
