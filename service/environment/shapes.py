"""Placement shape: how much a job loses when its GPUs are spread over servers and localities.

Gavel (``data.ThroughputTable``) measured one consolidated and one spread rate
per (job type, GPU count, class); it cannot tell ``1111`` (four servers of
one GPU) from ``22`` (two of two), nor one interconnect domain from several.
Pollux's artifact measured exactly that, on one GPU type (NVIDIA T4, 4 per
node, 50 Gbps between nodes): ``data/placement_shapes.csv`` (provenance
beside it). This module turns that table into a throughput multiplier.

`shape_factor(job_type, per_node, localities)` = throughput of the placement
``per_node`` (GPUs on each server) relative to the same GPUs on one server:

- **Measured.** One server: 1.0 (the reference). Two to four GPUs on two to
  four servers: the table's ``ratio_to_one_node`` for the model the job type
  maps to (`JOB_FAMILY_MODEL`); per-node order does not matter (``13`` and
  ``31`` are the same shape; where the table measured several orders of one
  shape, e.g. ``1124`` and ``1142``, their geometric mean).
- **Measured against the packed placement (8 GPUs).** The table measured 8-GPU
  shapes against ``44`` (two full nodes), not against one node: such a shape
  gets its measured ratio to ``44`` times the modelled factor of ``44``
  (next rule), so the 8-GPU comparisons the table makes are reproduced, up to
  the cap: a (partly) modelled factor is at most `MODELLED_CAP` (0.99).
- **Modelled, more GPUs than a Pollux node (e.g. 8 as 4+4).** The table has no
  one-node reference above 4 GPUs. The shape is mapped to the measured 4-GPU
  placement with the same number of servers and the nearest per-server
  proportions (4+4 -> ``22``, 2+2+2+2 -> ``1111``, 6+2 -> ``13``): what is lost
  depends on the share of the job behind each cross-server link. This keeps the
  measured 8-GPU direction (``44`` slower than ``2222`` for all six models).
- **Modelled, more than four servers.** The ``1111`` ratio raised to
  ``log(n) / log(4)``: the loss grows with the logarithm of the server count,
  calibrated at the four servers measured (monotone; never 1.0).
- **Cross-locality penalty (modelled, no public measurement found).** A job
  spanning more than one interconnect domain (the contract's ``locality``) is
  multiplied once by the model's measured two-server ratio ``11`` / ``2``: an
  assumption that the inter-domain link costs what the testbed's cross-node
  hop costs once more. Once, not per domain: a ring all-reduce runs at its
  slowest link, and every further domain adds a link of the same kind.
- **Unknown job type.** The median over the six models of the same rule.

Pure (csv + math): importable by ``service.learning`` (``service.policies`` and
``service.contract`` must not import ``service.environment``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from itertools import combinations_with_replacement
from statistics import median
from types import MappingProxyType

POLLUX_MODELS: tuple[str, ...] = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
"""The six models of the table."""

POLLUX_NODE_GPUS = 4
"""GPUs per node on Pollux's testbed (AWS g4dn.12xlarge, 4 x T4)."""

JOB_FAMILY_MODEL: Mapping[str, str] = MappingProxyType(
    {
        "ResNet-18": "cifar10",  # the same network and data set (CIFAR-10)
        "ResNet-50": "imagenet",  # the same network and data set (ImageNet)
        "Transformer": "bert",  # transformer encoder/decoder: large dense gradients
        "LM": "deepspeech2",  # recurrent (LSTM) model, as DeepSpeech2's RNN layers
        "Recommendation": "ncf",  # Gavel's Recommendation is neural collaborative filtering
        "CycleGAN": "yolov3",  # convolutional image-to-image model with small batches
        "A3C": "ncf",  # small model, latency-bound all-reduce (judgement: no RL model measured)
    }
)
"""Gavel job family (the job type without its batch size) -> Pollux model.

ResNet-18/CIFAR-10, ResNet-50/ImageNet and Recommendation/NCF are the same
workloads; the other four are the nearest by architecture (documented above).
"""

REPRESENTATIVE_JOB_TYPE: Mapping[str, str] = MappingProxyType(
    {
        "bert": "Transformer (batch size 64)",
        "cifar10": "ResNet-18 (batch size 64)",
        "deepspeech2": "LM (batch size 20)",
        "imagenet": "ResNet-50 (batch size 64)",
        "ncf": "Recommendation (batch size 2048)",
        "yolov3": "CycleGAN",
    }
)
"""One Gavel job type per Pollux model (a middle batch size), for tests and shape rows."""

MODELLED_CAP = 0.99
"""A shape whose factor is (partly) modelled is never above this: the one-node
reference it is compared with was not measured, and a spread placement is never
silently as fast as one server. Measured ratios are kept as measured."""

_DATA = "placement_shapes.csv"


@dataclass(frozen=True, slots=True)
class ShapeRow:
    """One measured placement of one model (a row of the derived table)."""

    model: str
    placement: str
    gpus: int
    nodes: int
    local_bsz: int
    throughput: float
    ratio_to_one_node: float | None
    ratio_to_packed: float

    @property
    def per_node(self) -> tuple[int, ...]:
        """GPUs per node, sorted descending (the shape, order-free)."""
        return tuple(sorted((int(c) for c in self.placement), reverse=True))


@dataclass(frozen=True, eq=False)
class PlacementShapes:
    """The derived table, indexed by (model, shape)."""

    rows: tuple[ShapeRow, ...]

    def ratio(self, model: str, per_node: tuple[int, ...], packed: bool = False) -> float | None:
        """Measured throughput relative to one node (`packed`: to the packed placement).

        None if not measured. Several measured orders of one shape: their
        geometric mean.
        """
        key = tuple(sorted(per_node, reverse=True))
        found = [
            r.ratio_to_packed if packed else r.ratio_to_one_node
            for r in self.rows
            if r.model == model and r.per_node == key
        ]
        values = [x for x in found if x is not None]
        if not values:
            return None
        return math.exp(sum(math.log(x) for x in values) / len(values))

    def packed_shape(self, model: str, gpus: int) -> tuple[int, ...] | None:
        """The fewest-node measured placement of `gpus` GPUs (``44`` at 8), None if none."""
        same = [r for r in self.rows if r.model == model and r.gpus == gpus]
        if not same:
            return None
        return min(same, key=lambda q: (q.nodes, q.placement)).per_node

    def measured_ratios(self) -> list[ShapeRatio]:
        """The acceptance tests' hook: every measured multi-node shape and its ratio.

        One entry per (model, shape), per-node order dropped (the simulator and
        the contract cannot tell ``1322`` from ``1223``): the geometric mean of
        the measured orders, against one node where the table has it (2-4
        GPUs), else against the packed placement (``44`` at 8 GPUs). A
        predictor's or the simulator's ratio for the same model and shapes must
        lie on the same side of 1.
        """
        out = []
        seen: set[tuple[str, tuple[int, ...]]] = set()
        for r in self.rows:
            if r.nodes == 1 or (r.model, r.per_node) in seen:
                continue
            seen.add((r.model, r.per_node))
            orders = tuple(
                q.placement for q in self.rows if q.model == r.model and q.per_node == r.per_node
            )
            if r.ratio_to_one_node is not None:
                value = self.ratio(r.model, r.per_node)
                ref: tuple[int, ...] = (r.gpus,)
            else:
                packed = self.packed_shape(r.model, r.gpus)
                assert packed is not None
                if packed == r.per_node:
                    continue  # the reference itself says nothing
                value, ref = self.ratio(r.model, r.per_node, packed=True), packed
            assert value is not None
            out.append(ShapeRatio(r.model, r.per_node, r.gpus, ref, value, orders))
        return out


@dataclass(frozen=True, slots=True)
class ShapeRatio:
    """A measured shape of one model: throughput relative to `reference` (all orders)."""

    model: str
    per_node: tuple[int, ...]
    gpus: int
    reference: tuple[int, ...]
    measured: float
    placements: tuple[str, ...]


@lru_cache(maxsize=1)
def load_placement_shapes() -> PlacementShapes:
    """Read ``service/environment/data/placement_shapes.csv`` (package data)."""
    text = resources.files("service.environment").joinpath("data", _DATA).read_text()
    rows = []
    for r in csv.DictReader(text.splitlines()):
        rows.append(
            ShapeRow(
                model=r["model"],
                placement=r["placement"],
                gpus=int(r["gpus"]),
                nodes=int(r["nodes"]),
                local_bsz=int(r["local_bsz"]),
                throughput=float(r["throughput_samples_per_s"]),
                ratio_to_one_node=float(r["ratio_to_one_node"]) if r["ratio_to_one_node"] else None,
                ratio_to_packed=float(r["ratio_to_packed"]),
            )
        )
    return PlacementShapes(tuple(rows))


def model_for(job_type: str) -> str | None:
    """The Pollux model a job type maps to (`JOB_FAMILY_MODEL`), None when unknown."""
    family = job_type.split(" (")[0].strip()
    if family in POLLUX_MODELS:
        return family
    return JOB_FAMILY_MODEL.get(family)


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Shapes (descending) of `total` GPUs on `parts` servers, each >= 1."""
    out = []
    for combo in combinations_with_replacement(range(1, total + 1), parts):
        if sum(combo) == total:
            out.append(tuple(sorted(combo, reverse=True)))
    return out


def _nearest_pollux_shape(per_node: tuple[int, ...]) -> tuple[int, ...]:
    """The 4-GPU shape on as many servers (<= 4) with the nearest per-server proportions."""
    n = len(per_node)
    total = sum(per_node)
    want = sorted((x / total for x in per_node), reverse=True)
    best = min(
        _compositions(POLLUX_NODE_GPUS, n),
        key=lambda c: (sum(abs(a - b / POLLUX_NODE_GPUS) for a, b in zip(want, c, strict=True)), c),
    )
    return best


def _model_factor(shapes: PlacementShapes, model: str, per_node: tuple[int, ...]) -> float:
    """Shape ratio for one model, one locality (the rules in the module docstring)."""
    if len(per_node) == 1:
        return 1.0
    measured = shapes.ratio(model, per_node)
    if measured is not None:
        return measured
    packed = shapes.packed_shape(model, sum(per_node))
    to_packed = shapes.ratio(model, per_node, packed=True)
    if packed is not None and to_packed is not None and len(packed) > 1:
        # measured against the packed placement (8 GPUs: against 44), which is modelled
        return min(MODELLED_CAP, to_packed * _modelled(shapes, model, packed))
    return min(MODELLED_CAP, _modelled(shapes, model, per_node))


def _modelled(shapes: PlacementShapes, model: str, per_node: tuple[int, ...]) -> float:
    """A shape with no one-node measurement: nearest 4-GPU shape, or log extrapolation."""
    n = len(per_node)
    if n > POLLUX_NODE_GPUS:
        base = shapes.ratio(model, (1,) * POLLUX_NODE_GPUS)
        assert base is not None
        return float(base ** (math.log(n) / math.log(POLLUX_NODE_GPUS)))
    mapped = shapes.ratio(model, _nearest_pollux_shape(per_node))
    assert mapped is not None, (model, per_node)
    return mapped


def shape_factor(job_type: str, per_node: tuple[int, ...], localities: int = 1) -> float:
    """Throughput of `per_node` across `localities` domains / the same GPUs on one server.

    Args:
        job_type: Gavel job type (or a Pollux model name); unknown -> median of the six.
        per_node: GPUs on each server the job spans (order does not matter).
        localities: interconnect domains spanned, 1 .. len(per_node).

    Raises:
        ValueError: naming the bad argument.
    """
    if not per_node or any(int(x) < 1 for x in per_node):
        raise ValueError(f"`per_node` must list >= 1 GPU per server, got {per_node!r}")
    if not 1 <= localities <= len(per_node):
        raise ValueError(f"`localities` must be in [1, {len(per_node)}], got {localities}")
    shape = tuple(sorted((int(x) for x in per_node), reverse=True))
    shapes = load_placement_shapes()
    model = model_for(job_type)
    models = (model,) if model is not None else POLLUX_MODELS
    values = []
    for m in models:
        factor = _model_factor(shapes, m, shape)
        if localities > 1:  # the ring's slowest link crosses a domain: once
            hop = shapes.ratio(m, (1, 1))
            assert hop is not None
            factor *= hop
        values.append(factor)
    return float(median(values))


def with_gavel(
    job_type: str, per_node: tuple[int, ...], localities: int, gavel_spread_ratio: float
) -> float:
    """A gang's rate / the consolidated rate, Pollux's shapes combined with Gavel's spread.

    ``shape_factor(type, per_node, localities) x min(1, g / shape_factor(type, 1...1))``
    with ``g`` Gavel's measured unconsolidated / consolidated ratio for (type,
    GPUs, class), NaN where Gavel did not measure both. Pollux's measured shapes
    (T4) give the loss of each shape; where Gavel measured a larger loss for
    its own spread placement (taken as one GPU per server) on a class — faster
    GPUs lose more to the same network — that extra loss is kept, so Gavel's
    figure stays what it is for that placement. Where Gavel measured a smaller
    loss (or none), Pollux's shape loss stands: a gang is never as fast as one
    server. The simulator's rates use it (`sharing.gang_factor`).
    """
    base = shape_factor(job_type, per_node, localities)
    g = gavel_spread_ratio
    if not (math.isfinite(g) and g > 0) or len(per_node) == 1:
        return base
    ones = shape_factor(job_type, (1,) * sum(per_node), 1)
    return base * min(1.0, g / ones)
