"""An exported Parquet slice (``understudy export``) as a source for OPE, read in record batches.

DuckDB scans the Hive-partitioned dataset (``date=.../policy=...``), applies
the same `OpeFilter` as the live read (``received_at`` window in integer
microseconds, as PostgreSQL's ``to_timestamp`` rounds; policy, workload kind,
tenant, model family) and returns the rows ordered by ``(seq, policy,
policy_version)``: ``seq`` is the round's position in the live log's
``(received_at, request_id)`` order, so a slice reproduces the live read's
order — which the cross-fitted DR model's folds depend on. The sort spills to
disk when the slice is larger than DuckDB's memory limit; rows then come out
`batch_rows` at a time.

Two consumers: `read_parquet_log` rebuilds the same `OpeLog` the live read
gives (for slices that fit in memory: the evidence package, plots), and
``service.reports.ope.parquet_ope`` folds the batches into additive
per-round sums, for slices of any size.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from service.contract import InvalidInput
from service.storage.export.parquet import MANIFEST, SCHEMA_KEY, SCHEMA_VERSION
from service.storage.reads.ope import UNKNOWN_OPTION, OpeFilter, OpeLog, PolicyLog, Progress

COLUMNS = (
    "seq",
    "request_id",
    "epoch_us(received_at) AS received_us",
    "n_options",
    "workload_kind",
    "tenant",
    "model_family",
    "production_option",
    "production_propensity",
    "queue_delay_s",
    "throughput",
    "completion_time_s",
    "slo_met",
    "failure",
    "policy",
    "policy_version",
    "status",
    "probabilities",
    "defer_probability",
    "raw_favourite_infeasible",
    "production_probabilities",
)
"""What OPE reads from a slice."""


@dataclass(frozen=True, slots=True)
class ParquetSlice:
    """A checked slice folder: its data files exist and carry a schema this code reads."""

    root: Path
    schema_version: str
    empty: bool = False
    """An export that matched no rows: a manifest and no data files."""
    production_distribution: bool = True
    """Whether the files carry ``production_probabilities`` (slices exported before it
    was added read as if no round had production's whole distribution)."""

    @property
    def glob(self) -> str:
        """Every data file of the dataset."""
        return str(self.root / "**" / "*.parquet")


def open_slice(root: Path) -> ParquetSlice:
    """Check `root` is a slice written by ``understudy export`` with a readable schema.

    Raises `InvalidInput` naming ``parquet`` when it is missing, empty, or of another
    major schema version.
    """
    if not root.is_dir():
        raise InvalidInput("parquet", f"must be a slice folder written by export, got {root}")
    first = next(iter(sorted(root.rglob("*.parquet"))), None)
    if first is None:
        if _manifest_schema(root) == SCHEMA_VERSION:
            return ParquetSlice(root, SCHEMA_VERSION, empty=True)
        raise InvalidInput("parquet", f"must contain Parquet files, found none under {root}")
    metadata = pq.read_schema(first).metadata or {}
    version = metadata.get(SCHEMA_KEY, b"").decode()
    if version != SCHEMA_VERSION:
        raise InvalidInput(
            "parquet", f"must have schema {SCHEMA_VERSION}, got {version or 'none'} in {first}"
        )
    names = pq.read_schema(first).names
    return ParquetSlice(root, version, production_distribution="production_probabilities" in names)


def _manifest_schema(root: Path) -> str | None:
    try:
        return str(json.loads((root / MANIFEST).read_text())["schema"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


PG_EPOCH_S = 946_684_800
"""2000-01-01 in Unix seconds: PostgreSQL counts timestamps from there."""


def pg_micros(seconds: float) -> int:
    """Unix microseconds of PostgreSQL's ``to_timestamp(seconds)``, rounded as it rounds
    (``rint`` of the microseconds since 2000), so a window cuts the same rows here as there."""
    return round((seconds - PG_EPOCH_S) * 1_000_000) + PG_EPOCH_S * 1_000_000


def _query(where: OpeFilter, columns: str) -> tuple[str, dict[str, Any]]:
    conditions = ["TRUE"]
    params: dict[str, Any] = {}
    if where.since is not None:
        conditions.append("epoch_us(received_at) >= $since")
        params["since"] = pg_micros(where.since)
    if where.until is not None:
        conditions.append("epoch_us(received_at) < $until")
        params["until"] = pg_micros(where.until)
    if where.policies:
        conditions.append("list_contains($policies, policy)")
        params["policies"] = list(where.policies)
    for column in ("workload_kind", "tenant", "model_family"):
        value = getattr(where, column)
        if value is not None:
            conditions.append(f"{column} = ${column}")
            params[column] = value
    source = (
        "read_parquet($glob, hive_partitioning = true, "
        "hive_types = {'date': VARCHAR, 'policy': VARCHAR})"
    )
    return f"SELECT {columns} FROM {source} WHERE {' AND '.join(conditions)}", params


@dataclass(frozen=True, slots=True)
class SliceSize:
    """What one aggregate over the filtered slice says before it is scanned.

    Attributes:
        rows: decision rows.
        most_options: the most options of a request (the estimator width is this + 1).
        first, last: earliest and latest ``received_at``, Unix seconds (NaN when empty).
    """

    rows: int
    most_options: int
    first: float
    last: float


def slice_size(source: ParquetSlice, where: OpeFilter) -> SliceSize:
    """Count and extent of the filtered slice."""
    if source.empty:
        return SliceSize(0, 0, math.nan, math.nan)
    sql, params = _query(
        where,
        "count(*), coalesce(max(n_options), 0), "
        "min(epoch_us(received_at)), max(epoch_us(received_at))",
    )
    with _connect(None) as con:
        rows, options, first, last = con.sql(
            sql, params={**params, "glob": source.glob}
        ).fetchall()[0]
    return SliceSize(
        int(rows),
        int(options),
        math.nan if first is None else first / 1e6,
        math.nan if last is None else last / 1e6,
    )


@contextmanager
def _connect(memory_limit: str | None) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB that spills its sort to a private temp folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="understudy-duckdb-") as spill:
        config: dict[str, str | bool | int | float | list[str]] = {"temp_directory": spill}
        if memory_limit is not None:
            config["memory_limit"] = memory_limit
        with duckdb.connect(config=config) as con:
            yield con


def scan(
    source: ParquetSlice,
    where: OpeFilter,
    *,
    batch_rows: int = 50_000,
    memory_limit: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The filtered rows in `COLUMNS`, ordered by ``(seq, policy, policy_version)``.

    `memory_limit` (DuckDB syntax, e.g. ``"512MB"``; default 80% of RAM) bounds
    the sort, which spills to disk beyond it.
    """
    if source.empty:
        return
    columns = COLUMNS
    if not source.production_distribution:
        columns = (*COLUMNS[:-1], "NULL::DOUBLE[] AS production_probabilities")
    sql, params = _query(where, ", ".join(columns))
    sql += " ORDER BY seq, policy, policy_version"
    with _connect(memory_limit) as con:
        reader = con.sql(sql, params={**params, "glob": source.glob}).to_arrow_reader(batch_rows)
        yield from reader


@dataclass(frozen=True, eq=False)
class Rows:
    """One record batch as numpy columns (one entry per decision row).

    ``probabilities`` stays as the Arrow list's flat `values` and `offsets`
    (row ``i`` is ``values[offsets[i]:offsets[i + 1]]``).

    `as_log` views the rows as rounds of an `OpeLog` (without policies), so
    ``Reward.of`` reads the reward exactly as on the live log.
    """

    seq: NDArray[np.int64]
    log: OpeLog
    policy: NDArray[np.str_]
    version: NDArray[np.str_]
    status: NDArray[np.str_]
    offsets: NDArray[np.int64]
    values: NDArray[np.float64]
    defer_probability: NDArray[np.float64]
    raw_favourite_infeasible: NDArray[np.bool_]

    @property
    def n(self) -> int:
        """Rows."""
        return len(self.seq)

    def probabilities(self, i: int) -> NDArray[np.float64]:
        """Row `i`'s distribution over its options (the ``probabilities`` list)."""
        return self.values[self.offsets[i] : self.offsets[i + 1]].copy()

    def policy_log(self, rows: NDArray[np.int64]) -> PolicyLog:
        """The decisions at `rows` as a `PolicyLog` aligned with them."""
        return PolicyLog(
            status=[str(self.status[i]) for i in rows],
            probabilities=[self.probabilities(i) for i in rows],
            defer_probability=self.defer_probability[rows],
            raw_favourite_infeasible=self.raw_favourite_infeasible[rows],
        )


def _floats(batch: pa.RecordBatch, name: str) -> NDArray[np.float64]:
    column = pc.cast(batch.column(name), pa.float64())
    return np.asarray(column.fill_null(np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def _strings(batch: pa.RecordBatch, name: str) -> NDArray[np.str_]:
    return np.array(batch.column(name).to_pylist(), dtype=np.str_)


def _optional_lists(batch: pa.RecordBatch, name: str) -> list[NDArray[np.float64] | None]:
    """A nullable list<float64> column as one array (or None) per row."""
    return [
        None if x is None else np.asarray(x, dtype=np.float64)
        for x in batch.column(name).to_pylist()
    ]


def rows_of(batch: pa.RecordBatch) -> Rows:
    """Numpy columns of one scanned batch."""
    lists = batch.column("probabilities")
    offsets = np.asarray(lists.offsets.to_numpy(), dtype=np.int64)
    values = np.asarray(lists.values.to_numpy(zero_copy_only=False), dtype=np.float64)
    option = batch.column("production_option").fill_null(UNKNOWN_OPTION)
    log = OpeLog(
        request_id=_strings(batch, "request_id"),
        received_at=_floats(batch, "received_us") / 1e6,
        n_options=np.asarray(batch.column("n_options").to_numpy(), dtype=np.int64),
        workload_kind=_strings(batch, "workload_kind"),
        tenant=_strings(batch, "tenant"),
        model_family=_strings(batch, "model_family"),
        production_option=np.asarray(option.to_numpy(), dtype=np.int64),
        production_propensity=_floats(batch, "production_propensity"),
        queue_delay_s=_floats(batch, "queue_delay_s"),
        throughput=_floats(batch, "throughput"),
        completion_time_s=_floats(batch, "completion_time_s"),
        slo_met=_floats(batch, "slo_met"),
        failure=_strings(batch, "failure"),
        production_distribution=_optional_lists(batch, "production_probabilities"),
    )
    return Rows(
        seq=np.asarray(batch.column("seq").to_numpy(), dtype=np.int64),
        log=log,
        policy=_strings(batch, "policy"),
        version=_strings(batch, "policy_version"),
        status=_strings(batch, "status"),
        offsets=offsets,
        values=values,
        defer_probability=_floats(batch, "defer_probability"),
        raw_favourite_infeasible=np.asarray(
            batch.column("raw_favourite_infeasible")
            .fill_null(False)
            .to_numpy(zero_copy_only=False),
            dtype=bool,
        ),
    )


def read_parquet_log(
    root: Path,
    where: OpeFilter | None = None,
    *,
    batch_rows: int = 50_000,
    progress: Progress | None = None,
) -> OpeLog:
    """The same `OpeLog` as ``read_ope_log`` gives on the live log for `where`.

    Holds the whole slice in memory: for slices larger than memory use
    ``service.reports.ope.parquet_ope.stream_ope``.
    """
    f = where or OpeFilter()
    source = open_slice(root)
    total = slice_size(source, f).rows
    parts: list[Rows] = []
    read = 0
    for batch in scan(source, f, batch_rows=batch_rows):
        parts.append(rows_of(batch))
        read += batch.num_rows
        if progress is not None:
            progress(read, total)
    return _assemble(parts)


def _assemble(parts: list[Rows]) -> OpeLog:
    seq = np.concatenate([p.seq for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    rounds, first = np.unique(seq, return_index=True)

    def column(name: str) -> Any:
        if not parts:
            return np.zeros(0, dtype=np.str_ if name in _TEXT else np.float64)
        return np.concatenate([getattr(p.log, name) for p in parts])[first]

    policies: dict[tuple[str, str], PolicyLog] = {}
    keys = sorted({k for p in parts for k in zip(p.policy, p.version, strict=True)})
    for key in keys:
        status = [""] * len(rounds)
        probs: list[NDArray[np.float64] | None] = [None] * len(rounds)
        defer = np.full(len(rounds), np.nan)
        raw = np.zeros(len(rounds), dtype=bool)
        for p in parts:
            rows = np.flatnonzero((p.policy == key[0]) & (p.version == key[1]))
            at = np.searchsorted(rounds, p.seq[rows])
            for i, j in zip(rows, at, strict=True):
                status[j] = str(p.status[i])
                probs[j] = p.probabilities(int(i))
            defer[at] = p.defer_probability[rows]
            raw[at] = p.raw_favourite_infeasible[rows]
        policies[(str(key[0]), str(key[1]))] = PolicyLog(status, probs, defer, raw)
    distributions = [x for p in parts for x in p.log.production_distribution]
    return OpeLog(
        request_id=column("request_id"),
        received_at=column("received_at"),
        n_options=column("n_options").astype(np.int64),
        workload_kind=column("workload_kind"),
        tenant=column("tenant"),
        model_family=column("model_family"),
        production_option=column("production_option").astype(np.int64),
        production_propensity=column("production_propensity"),
        queue_delay_s=column("queue_delay_s"),
        throughput=column("throughput"),
        completion_time_s=column("completion_time_s"),
        slo_met=column("slo_met"),
        failure=column("failure"),
        policies=policies,
        production_distribution=[distributions[j] for j in first.tolist()],
    )


_TEXT = frozenset({"request_id", "workload_kind", "tenant", "model_family", "failure"})
