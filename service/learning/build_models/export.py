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

With a shape model (`QuantileModels.shape`), its output (the log gang-shape
factor, times ``1 - consolidated``) is added to each quantile first.

With a training support (`support.TrainingSupport`), the graph also tests
every row against it — nearest training configuration by max-abs difference
over the cell columns, and every column against its training range — and
outside it widens ``lo`` / ``hi`` to at least ``q50 -/+`` the widest
half-widths seen in training; the flag is the second output,
``out_of_support`` (``[N, 1]``, 1.0 outside).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType

from service.learning.build_models.predictor_fit import CONSOLIDATED, QuantileModels
from service.learning.build_models.support import TOLERANCE, TrainingSupport

OPSET = {"": 17, "ai.onnx.ml": 3}
INPUT = "features"
PREDICTOR_OUTPUT = "throughput_quantiles"
SUPPORT_OUTPUT = "out_of_support"
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
    model: onnx.ModelProto, tag: str, source: str = INPUT
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """Nodes and initializers of `model` with every name but the shared input prefixed;
    the input itself is read from `source`."""

    def rename(name: str) -> str:
        if name == INPUT:
            return source
        return name if name == "" else f"{tag}_{name}"

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
    source = INPUT
    if models.mask is not None:  # the quantile trees see the masked columns only
        inits.append(numpy_helper.from_array(models.mask.astype(np.float32), "quantile_mask"))
        nodes.append(
            helper.make_node("Mul", [INPUT, "quantile_mask"], ["masked"], name="quantile_mask")
        )
        source = "masked"
    for tag, m in (("q10", models.lo), ("q50", models.mid), ("q90", models.hi)):
        n, i, out = _prefixed(_convert(m, n_features, f"gavel_{tag}"), tag, source)
        nodes += n
        inits += i
        outs.append(out)
    if models.shape is not None:  # the log shape factor, added to every quantile
        n, i, raw = _prefixed(_convert(models.shape, n_features, "gavel_shape"), "shape")
        nodes += n
        inits += i
        inits += [
            numpy_helper.from_array(np.array([CONSOLIDATED], dtype=np.int64), "shape_col"),
            numpy_helper.from_array(np.array([CONSOLIDATED + 1], dtype=np.int64), "shape_col_end"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "shape_axis"),
            numpy_helper.from_array(np.array([1.0], dtype=np.float32), "shape_one"),
        ]
        nodes += [  # term = shape(x) * (1 - consolidated): one-server rows get none
            helper.make_node(
                "Slice",
                [INPUT, "shape_col", "shape_col_end", "shape_axis"],
                ["shape_cons"],
                name="shape_slice",
            ),
            helper.make_node("Sub", ["shape_one", "shape_cons"], ["shape_gate"], name="shape_gate"),
            helper.make_node("Mul", [raw, "shape_gate"], ["shape_term"], name="shape_term"),
        ]
        for k, tag in enumerate(("q10", "q50", "q90")):
            nodes.append(
                helper.make_node(
                    "Add", [outs[k], "shape_term"], [f"{tag}_shaped"], name=f"shape_{tag}"
                )
            )
            outs[k] = f"{tag}_shaped"
    inits.append(numpy_helper.from_array(np.array([models.offset], dtype=np.float32), "offset"))
    lo, hi = ("lo_wide", "hi_wide") if models.support is None else ("lo_final", "hi_final")
    nodes += [
        helper.make_node("Min", [outs[0], outs[1]], ["lo_ordered"], name="order_lo"),
        helper.make_node("Max", [outs[2], outs[1]], ["hi_ordered"], name="order_hi"),
        helper.make_node("Sub", ["lo_ordered", "offset"], ["lo_wide"], name="conformal_lo"),
        helper.make_node("Add", ["hi_ordered", "offset"], ["hi_wide"], name="conformal_hi"),
    ]
    outputs = [helper.make_tensor_value_info(PREDICTOR_OUTPUT, TensorProto.FLOAT, [None, 3])]
    if models.support is not None:
        n, i = _support_nodes(models.support, outs[1])
        nodes += n
        inits += i
        outputs.append(helper.make_tensor_value_info(SUPPORT_OUTPUT, TensorProto.FLOAT, [None, 1]))
    nodes += [
        helper.make_node("Concat", [lo, outs[1], hi], ["log_q"], axis=1, name="stack"),
        helper.make_node("Exp", ["log_q"], [PREDICTOR_OUTPUT], name="to_steps_per_s"),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [None, n_features])],
        outputs,
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


def _support_nodes(
    support: TrainingSupport, mid: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing ``out_of_support`` and ``lo_final`` / ``hi_final`` (see the docstring).

    Mirrors `TrainingSupport.outside` and `TrainingSupport.widen` op for op.
    """

    def const(value: NDArray[Any], name: str) -> onnx.TensorProto:
        return numpy_helper.from_array(value, name)

    k = support.n_cell_columns
    inits = [
        const(support.cells[None, :, :].astype(np.float32), "support_cells"),
        const(np.array([0], dtype=np.int64), "support_start"),
        const(np.array([k], dtype=np.int64), "support_end"),
        const(np.array([1], dtype=np.int64), "support_axis"),
        const((support.low - TOLERANCE).astype(np.float32), "support_low"),
        const((support.high + TOLERANCE).astype(np.float32), "support_high"),
        const(np.array([TOLERANCE], dtype=np.float32), "support_tol"),
        const(np.array([support.half_width_lo], dtype=np.float32), "support_half_lo"),
        const(np.array([support.half_width_hi], dtype=np.float32), "support_half_hi"),
    ]
    make = helper.make_node
    nodes = [
        make("Slice", [INPUT, "support_start", "support_end", "support_axis"], ["s_cells_x"]),
        make("Unsqueeze", ["s_cells_x", "support_axis"], ["s_x3"]),
        make("Sub", ["s_x3", "support_cells"], ["s_diff"]),
        make("Abs", ["s_diff"], ["s_absdiff"]),
        make("ReduceMax", ["s_absdiff"], ["s_rowdist"], axes=[2], keepdims=0),
        make("ReduceMin", ["s_rowdist"], ["s_nearest"], axes=[1], keepdims=1),
        make("Greater", ["s_nearest", "support_tol"], ["s_unseen"]),
        make("Less", [INPUT, "support_low"], ["s_below"]),
        make("Greater", [INPUT, "support_high"], ["s_above"]),
        make("Or", ["s_below", "s_above"], ["s_outside_col"]),
        make("Cast", ["s_outside_col"], ["s_outside_colf"], to=TensorProto.FLOAT),
        make("ReduceMax", ["s_outside_colf"], ["s_out_rangef"], axes=[1], keepdims=1),
        make("Cast", ["s_unseen"], ["s_unseenf"], to=TensorProto.FLOAT),
        make("Max", ["s_unseenf", "s_out_rangef"], [SUPPORT_OUTPUT]),
        make("Cast", [SUPPORT_OUTPUT], ["s_outside"], to=TensorProto.BOOL),
        make("Sub", [mid, "support_half_lo"], ["s_lo_floor"]),
        make("Add", [mid, "support_half_hi"], ["s_hi_floor"]),
        make("Min", ["lo_wide", "s_lo_floor"], ["s_lo_widest"]),
        make("Max", ["hi_wide", "s_hi_floor"], ["s_hi_widest"]),
        make("Where", ["s_outside", "s_lo_widest", "lo_wide"], ["lo_final"]),
        make("Where", ["s_outside", "s_hi_widest", "hi_wide"], ["hi_final"]),
    ]
    for n, node in enumerate(nodes):
        node.name = f"support_{n}_{node.op_type.lower()}"
    return nodes, inits


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
