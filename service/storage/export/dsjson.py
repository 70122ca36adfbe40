"""An evaluation slice as Decision Service JSON (DSJSON), the log format of Vowpal Wabbit's tools.

One line per joined round: the decision that acted (production's) with its
label, the round's actions in ``c._multi``, and every logged candidate's
distribution under ``_understudy`` (VW skips top-level keys it does not know).
The mapping, and the VW wiki page it follows, are in docs/export.md:

==========================  ==================================================
``_label_cost``             ``-reward`` (VW minimises cost)
``_label_probability``      production's propensity of the action it took
``_label_Action``           production's action, 1-based; DEFER is ``n_options + 1``
``_labelIndex``             the same, 0-based: its index in ``c._multi``
``a``                       every action, 1-based, the taken one first
``p``                       production's probabilities of the actions of ``a``, in
                            ``a``'s order, when Runtime sent its whole distribution
                            (``production_probabilities``); else
                            ``[_label_probability]``, the taken action's only
``o``                       ``[{"v": reward, "EventId": ...}]``, the outcome event
``EventId``, ``Timestamp``  request id, ``received_at`` (``...T..:..:..ffffffZ``)
``Version``                 ``"1"``
``c``                       shared namespace ``Workload`` + ``_multi`` (namespace ``Option``)
==========================  ==================================================

Rounds without an observed reward or a usable production decision cannot be
labelled and are skipped (counted). Input is the record batches of
``service.storage.export.parquet.iter_slice`` (rows of a round are contiguous).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import orjson
import pyarrow as pa

DSJSON_SCHEMA = "understudy-dsjson/1"
"""Version of the ``_understudy`` extension object."""
USABLE_STATUSES = frozenset({"ok", "timeout", "all_infeasible", "infeasible_choice"})

RewardOf = Callable[[Mapping[str, Any]], float | None]
"""A round's reward from its row (outcome columns), None when not observed."""


@dataclass(frozen=True, slots=True)
class DsjsonSummary:
    """Lines written and rounds skipped, by reason."""

    lines: int
    no_reward: int
    no_production: int


def _timestamp(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _label_column(row: Mapping[str, Any]) -> int | None:
    """Production's action column (DEFER = ``n_options``), None when unusable."""
    option, p, k = row["production_option"], row["production_propensity"], row["n_options"]
    if option is None or option >= k or p is None or not (0 < p <= 1):
        return None
    return k if option < 0 else int(option)


def _distribution(row: Mapping[str, Any], order: list[int]) -> list[float] | None:
    """The candidate's probabilities over the actions in `order` (0-based), or None."""
    probs = row["probabilities"]
    k = row["n_options"]
    if row["status"] not in USABLE_STATUSES or probs is None or len(probs) != k:
        return None
    defer = row["defer_probability"]
    full = [*probs, 0.0 if defer is None or math.isnan(defer) else defer]
    return [full[i] for i in order]


def _production_p(row: Mapping[str, Any], order: list[int], p: float) -> list[float]:
    """DSJSON ``p``: production's distribution over `order` when it was logged whole
    (options then DEFER, one value per action), else only the taken action's `p`."""
    full = row.get("production_probabilities")
    if full is None or len(full) != int(row["n_options"]) + 1:
        return [p]
    return [float(full[i]) for i in order]


def dsjson_line(rows: Sequence[Mapping[str, Any]], reward: float, column: int) -> dict[str, Any]:
    """The DSJSON event of one round (`rows`: its decision rows; `column`: production's)."""
    first = rows[0]
    k = int(first["n_options"])
    order = [column] + [i for i in range(k + 1) if i != column]
    p = float(first["production_propensity"])
    multi = [{"Option": {"id": f"option-{i}"}} for i in range(k)]
    multi.append({"Option": {"id": "defer"}})
    return {
        "_label_cost": -reward,
        "_label_probability": p,
        "_label_Action": column + 1,
        "_labelIndex": column,
        "o": [{"v": reward, "EventId": first["request_id"]}],
        "Timestamp": _timestamp(first["received_at"]),
        "Version": "1",
        "EventId": first["request_id"],
        "a": [i + 1 for i in order],
        "p": _production_p(first, order, p),
        "c": {
            "Workload": {
                "kind": first["workload_kind"],
                "tenant": first["tenant"],
                "model_family": first["model_family"],
            },
            "_multi": multi,
        },
        "_understudy": {
            "schema": DSJSON_SCHEMA,
            "seq": first["seq"],
            "request_time": _timestamp(first["request_time"]),
            "n_options": k,
            "traffic": first["traffic"],
            "scenario": first["scenario"],
            "policies": {
                f"{r['policy']}@{r['policy_version']}": {
                    "status": r["status"],
                    "p": _distribution(r, order),
                }
                for r in rows
            },
        },
    }


def _rounds(batches: Iterator[pa.RecordBatch]) -> Iterator[list[dict[str, Any]]]:
    """The rows of each round, across batch boundaries."""
    current: list[dict[str, Any]] = []
    for batch in batches:
        for row in batch.to_pylist():
            if current and row["seq"] != current[0]["seq"]:
                yield current
                current = []
            current.append(row)
    if current:
        yield current


def write_dsjson(
    batches: Iterator[pa.RecordBatch], out: IO[bytes], reward_of: RewardOf
) -> DsjsonSummary:
    """Write one DSJSON line per labelled round of `batches` to `out`."""
    lines = no_reward = no_production = 0
    for rows in _rounds(batches):
        reward = reward_of(rows[0])
        if reward is None or math.isnan(reward):
            no_reward += 1
            continue
        column = _label_column(rows[0])
        if column is None:
            no_production += 1
            continue
        out.write(orjson.dumps(dsjson_line(rows, reward, column)) + b"\n")
        lines += 1
    return DsjsonSummary(lines, no_reward, no_production)
