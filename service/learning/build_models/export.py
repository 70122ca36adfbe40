"""Export fitted scikit-learn models to ONNX, byte-for-byte reproducibly.

skl2onnx names each graph with a random UUID unless told otherwise and lists
opsets in hash-seeded set order, so every conversion here passes a fixed name
and sorts the opsets; the same seed then gives the same bytes and sha256.

The predictor is one graph: the three tree ensembles share the ``features``
input, and the post-processing the Python model does — order the quantiles,
widen by the conformal offset, exponentiate — is written as ONNX ops, so
the service needs nothing but ``session.run``::

    features ─┬─ q10 ─┐
              ├─ q50 ─┼─ Min(q10, q50) - c ┐
              └─ q90 ─┘  Max(q90, q50) + c ┴─ Concat(lo, q50, hi) ─ Exp ─ throughput_quantiles
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType

from service.learning.build_models.predictor_fit import QuantileModels

OPSET = {"": 17, "ai.onnx.ml": 3}
INPUT = "features"
PREDICTOR_OUTPUT = "throughput_quantiles"
SCORER_OUTPUT = "scores"


def _convert(model: Any, n_features: int, name: str, output: str | None = None) -> onnx.ModelProto:
    final = [(output, FloatTensorType([None, 1]))] if output else None
    proto = convert_sklearn(
        model,
        name=name,
        initial_types=[(INPUT, FloatTensorType([None, n_features]))],
        target_opset=OPSET,
        final_types=final,
    )
    assert isinstance(proto, onnx.ModelProto)
    # skl2onnx lists opsets in set order (string-hash seeded per process): sort them.
    versions: dict[str, int] = {}
    for o in proto.opset_import:
        versions[o.domain] = max(versions.get(o.domain, 0), o.version)
    del proto.opset_import[:]
    proto.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(versions.items()))
    return proto


def _prefixed(
    model: onnx.ModelProto, tag: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """Nodes and initializers of `model` with every name but the shared input prefixed."""

    def rename(name: str) -> str:
        return name if name in ("", INPUT) else f"{tag}_{name}"

    nodes = []
    for node in model.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = rename(node.name or node.op_type)
        copy.ClearField("input")
        copy.ClearField("output")
        copy.input.extend(rename(i) for i in node.input)
        copy.output.extend(rename(o) for o in node.output)
        nodes.append(copy)
    inits = []
    for init in model.graph.initializer:
        t = onnx.TensorProto()
        t.CopyFrom(init)
        t.name = rename(init.name)
        inits.append(t)
    return nodes, inits, rename(model.graph.output[0].name)


def predictor_onnx(
    models: QuantileModels, n_features: int, name: str = "gavel_throughput"
) -> onnx.ModelProto:
    """One graph, named `name`, computing `QuantileModels.predict`."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    outs = []
    for tag, m in (("q10", models.lo), ("q50", models.mid), ("q90", models.hi)):
        n, i, out = _prefixed(_convert(m, n_features, f"gavel_{tag}"), tag)
        nodes += n
        inits += i
        outs.append(out)
    inits.append(numpy_helper.from_array(np.array([models.offset], dtype=np.float32), "offset"))
    nodes += [
        helper.make_node("Min", [outs[0], outs[1]], ["lo_ordered"], name="order_lo"),
        helper.make_node("Max", [outs[2], outs[1]], ["hi_ordered"], name="order_hi"),
        helper.make_node("Sub", ["lo_ordered", "offset"], ["lo_wide"], name="conformal_lo"),
        helper.make_node("Add", ["hi_ordered", "offset"], ["hi_wide"], name="conformal_hi"),
        helper.make_node(
            "Concat", ["lo_wide", outs[1], "hi_wide"], ["log_q"], axis=1, name="stack"
        ),
        helper.make_node("Exp", ["log_q"], [PREDICTOR_OUTPUT], name="to_steps_per_s"),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [None, n_features])],
        [helper.make_tensor_value_info(PREDICTOR_OUTPUT, TensorProto.FLOAT, [None, 3])],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in OPSET.items()],
        producer_name="understudy.build_models",
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def scorer_onnx(pipeline: Any, n_features: int, name: str = "gavel_scorer") -> onnx.ModelProto:
    """A scoring regressor (e.g. scaler + MLP) with output renamed to ``scores``."""
    model = _convert(pipeline, n_features, name, SCORER_OUTPUT)
    onnx.checker.check_model(model, full_check=True)
    return model


def write_model(model: onnx.ModelProto, path: Path) -> str:
    """Write `model` to `path`; return its sha256."""
    data = model.SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()
