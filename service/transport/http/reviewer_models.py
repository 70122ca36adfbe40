"""Response models of the reviewer API, their converters, and the CSV form.

The models stop at the transport (the storage reads return dataclasses).
Floats that are not finite (a failed policy's scores may be NaN) become null,
because JSON has no NaN. CSV rows are the JSON items flattened one level: a
column per field, null as an empty cell, booleans as ``true``/``false``,
floats in Python's shortest round-trip form, nested values as JSON text —
so ``csv.DictReader`` gets back exactly what the JSON says.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from service.storage.reads.log import LoggedDecision
from service.storage.reviewer.reads import DecisionItem, ExperimentItem
from service.storage.reviewer.request import RequestInFull
from service.transport.http.convert import mirror_to_json


class DecisionModel(BaseModel):
    """One decision with its request's indexed columns and outcome (times: Unix seconds)."""

    request_id: str
    request_time: float
    received_at: float
    policy_name: str
    policy_version: str
    status: str
    chosen_option: int
    deferred: bool
    chosen_probability: float | None
    defer_probability: float | None
    production_option: int | None
    production_propensity: float | None
    production_probability: float | None
    agrees_with_production: bool | None
    raw_favourite_infeasible: bool
    latency_us: int
    error: str | None
    scored_at: float
    workload_id: str
    workload_kind: str
    tenant: str
    model_family: str
    n_options: int
    feature_hash: str
    outcome_joined: bool
    slo_met: bool | None
    queue_delay_s: float | None
    throughput: float | None
    completion_time_s: float | None
    failure: str | None


class DecisionPageModel(BaseModel):
    """A page of decisions in key order; pass `next_cursor` as ``cursor`` for the next."""

    items: list[DecisionModel]
    next_cursor: str | None
    scanned: int


class ExperimentModel(BaseModel):
    """A recorded protocol version and its window (times: Unix seconds)."""

    protocol_id: str
    version: int
    state: str
    mode: str
    candidate_policy: str
    candidate_version: str
    candidate_sha256: str | None
    content_sha256: str
    owners: list[str]
    submitted_by: str
    recorded_at: float
    started_at: float | None
    ended_at: float | None
    approved_by: str | None
    approved_at: float | None
    n_events: int
    updated_at: float


class OptionModel(BaseModel):
    """A placement option: its nodes, their classes, and what the feasibility function says."""

    index: int
    option_id: str
    nodes: list[str]
    hardware: list[str]
    accelerators: list[int]
    feasible: bool
    failed_signals: list[str]


class OptionMaskModel(BaseModel):
    """One option's logged feasibility: which signals masked it (by the logged version's names).

    ``feasible`` and ``signals`` are null when the request's bits were not logged
    (rows from before migration 0010); ``signals`` is null too for a version this
    service does not know.
    """

    option: int
    option_id: str
    nodes: list[str]
    feasible: bool | None
    signals: list[str] | None


class LoggedFeasibilityModel(BaseModel):
    """The per-option signal bits the scorer logged for the request, decoded.

    ``status``: ``logged``, ``not logged`` (before migration 0010: see ``options``
    of the request for the replayed mask) or ``unknown version <v>``.
    ``matches_replay``: the logged bits equal the feasibility function's bits
    recomputed now (null when not logged or logged by another version).
    """

    version: str | None
    status: str
    matches_replay: bool | None
    options: list[OptionMaskModel]


class OptionMaskRowModel(BaseModel):
    """CSV form of `OptionMaskModel`, one row per option, flat: ``nodes`` and ``signals`` are
    names joined by ``;`` (empty ``signals`` and ``feasible`` = ``true``: nothing fired;
    empty ``feasible``: not logged)."""

    request_id: str
    feasibility_version: str | None
    status: str
    option: int
    option_id: str
    nodes: str
    feasible: bool | None
    signals: str


class FeaturesModel(BaseModel):
    """Features recomputed now; ``values[i]`` is option ``i``'s row."""

    version: str
    definition_hash: str
    logged_hash: str
    same_definition: bool
    names: list[str]
    values: list[list[float]]


class PolicyDecisionModel(BaseModel):
    """A policy's logged decision, blobs decoded: one score and probability per option."""

    policy_name: str
    policy_version: str
    status: str
    chosen_option: int
    chosen_probability: float | None
    production_probability: float | None
    defer_probability: float | None
    scores: list[float | None]
    probabilities: list[float | None]
    predicted: dict[str, float] | None
    raw_favourite_infeasible: bool
    agrees_with_production: bool | None
    latency_us: int
    error: str | None
    scored_at: float


class RequestInFullModel(BaseModel):
    """One request: as received, options, replayed features, decisions, outcome, protocols."""

    request_id: str
    request_time: float
    received_at: float
    journal_seq: int
    production_source: str | None
    request: dict[str, Any]
    options: list[OptionModel]
    logged_feasibility: LoggedFeasibilityModel
    features: FeaturesModel
    decisions: list[PolicyDecisionModel]
    outcome: dict[str, Any] | None
    protocols: list[ExperimentModel]


def _finite(values: Iterable[float]) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]


def decision_model(item: DecisionItem) -> DecisionModel:
    """Response form of a listed decision."""
    return DecisionModel.model_validate(item, from_attributes=True)


def experiment_model(item: ExperimentItem) -> ExperimentModel:
    """Response form of an experiment."""
    return ExperimentModel.model_validate(item, from_attributes=True)


def _policy_decision(d: LoggedDecision) -> PolicyDecisionModel:
    return PolicyDecisionModel(
        policy_name=d.policy_name,
        policy_version=d.policy_version,
        status=d.status,
        chosen_option=d.chosen_option,
        chosen_probability=d.chosen_probability,
        production_probability=d.production_probability,
        defer_probability=d.defer_probability,
        scores=_finite(d.scores.tolist()),
        probabilities=_finite(d.probabilities.tolist()),
        predicted=d.predicted,
        raw_favourite_infeasible=d.raw_favourite_infeasible,
        agrees_with_production=d.agrees_with_production,
        latency_us=d.latency_us,
        error=d.error,
        scored_at=d.scored_at,
    )


def logged_feasibility_model(full: RequestInFull) -> LoggedFeasibilityModel:
    """The request's logged masks, per option (see `LoggedFeasibilityModel`)."""
    req, logged = full.request, full.logged_feasibility
    state, options = req.state, req.options
    matches: bool | None = None
    if logged.bits is not None and logged.version == full.feasibility.version:
        matches = np.array_equal(logged.bits, full.feasibility.bits)
    items = []
    for i in range(options.n_options):
        signals = logged.signals(i)
        items.append(
            OptionMaskModel(
                option=i,
                option_id=options.option_ids[i] if options.option_ids else "",
                nodes=[state.node_ids[int(n)] for n in options.nodes_of(i)],
                feasible=logged.feasible(i),
                signals=list(signals) if signals is not None else None,
            )
        )
    return LoggedFeasibilityModel(
        version=logged.version, status=logged.status, matches_replay=matches, options=items
    )


def option_mask_rows(full: RequestInFull) -> list[OptionMaskRowModel]:
    """The CSV rows of the request's logged masks (see `OptionMaskRowModel`)."""
    model = logged_feasibility_model(full)
    return [
        OptionMaskRowModel(
            request_id=full.request_id,
            feasibility_version=model.version,
            status=model.status,
            option=o.option,
            option_id=o.option_id,
            nodes=";".join(o.nodes),
            feasible=o.feasible,
            signals=";".join(o.signals or ()),
        )
        for o in model.options
    ]


def request_model(full: RequestInFull) -> RequestInFullModel:
    """Response form of one request in full."""
    req, state, feas = full.request, full.request.state, full.feasibility
    options = []
    for i in range(req.options.n_options):
        nodes = req.options.nodes_of(i)
        lo, hi = int(req.options.node_offsets[i]), int(req.options.node_offsets[i + 1])
        options.append(
            OptionModel(
                index=i,
                option_id=req.options.option_ids[i] if req.options.option_ids else "",
                nodes=[state.node_ids[int(n)] for n in nodes],
                hardware=[state.hardware_of(int(n)).name for n in nodes],
                accelerators=[int(a) for a in req.options.accelerators[lo:hi]],
                feasible=bool(feas.mask[i]),
                failed_signals=[s.value for s in feas.failed(i)],
            )
        )
    f = full.features
    return RequestInFullModel(
        request_id=full.request_id,
        request_time=full.request_time,
        received_at=full.received_at,
        journal_seq=full.journal_seq,
        production_source=full.production_source,
        request=json.loads(mirror_to_json(req)),
        options=options,
        logged_feasibility=logged_feasibility_model(full),
        features=FeaturesModel(
            version=f.version,
            definition_hash=f.definition_hash,
            logged_hash=f.logged_hash,
            same_definition=f.same_definition,
            names=list(f.names),
            values=np.asarray(f.values, dtype=np.float64).tolist(),
        ),
        decisions=[_policy_decision(d) for d in full.decisions],
        outcome=full.outcome,
        protocols=[experiment_model(p) for p in full.protocols],
    )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def to_csv(rows: Sequence[BaseModel], model: type[BaseModel]) -> str:
    """CSV text, a header of `model`'s fields then one line per row (see module docstring)."""
    columns = list(model.model_fields)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        data = row.model_dump(mode="json")
        writer.writerow([_cell(data[c]) for c in columns])
    return out.getvalue()
