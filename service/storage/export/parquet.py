"""An evaluation slice of the decision log as Hive-partitioned Parquet (docs/export.md).

One row per (joined request, logged policy decision), the rounds being
exactly those `service.storage.reads.ope.read_ope_log` reads for the same
`OpeFilter` (same join, same conditions, same order), so OPE on the slice
equals OPE on the live log. The log is read with a server-side cursor,
`batch_rows` rows at a time, each chunk turned into one Arrow record batch and
handed to ``pyarrow.dataset.write_dataset`` as an iterator: memory stays
bounded by the batch, not the slice.

Layout: ``DIR/date=YYYY-MM-DD/policy=<name>/part-0.parquet`` (UTC date of
``received_at``), plus ``DIR/_slice.json`` (schema version, filter, counts);
pyarrow and DuckDB skip ``_``-prefixed files when reading the dataset. The
schema version is also in every file's key-value metadata
(``understudy.schema``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
from numpy.typing import NDArray
from sqlalchemy import BigInteger, Engine, cast, extract, func, select

from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.masks import SIGNALS_BY_VERSION
from service.storage.reads.ope import (
    OpeFilter,
    Progress,
    filter_conditions,  # the same filter as OPE
)
from service.storage.reads.ope import _source as joined_source  # the same join as OPE

SCHEMA_VERSION = "understudy-slice/1"
"""Name and major version of the slice schema; readers refuse another major."""
SCHEMA_KEY = b"understudy.schema"
MANIFEST = "_slice.json"
PARTITION_FIELDS = pa.schema([("date", pa.string()), ("policy", pa.string())])
"""Hive partition columns, in directory order."""

_TS = pa.timestamp("us", tz="UTC")

SLICE_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("request_id", pa.string()),
        ("request_time", _TS),
        ("received_at", _TS),
        ("workload_id", pa.string()),
        ("workload_kind", pa.string()),
        ("tenant", pa.string()),
        ("model_family", pa.string()),
        ("qos_class", pa.string()),  # null on rows logged before migration 0010
        ("n_options", pa.int32()),
        ("production_option", pa.int32()),
        ("production_propensity", pa.float64()),
        ("production_source", pa.string()),
        # production's whole distribution as Runtime sent it: the options, then DEFER;
        # null when not sent (requests.production_probabilities_f64)
        ("production_probabilities", pa.list_(pa.float64())),
        ("observed_at", _TS),
        ("queue_delay_s", pa.float64()),
        ("throughput", pa.float64()),
        ("completion_time_s", pa.float64()),
        ("slo_met", pa.bool_()),
        ("failure", pa.string()),
        ("policy_version", pa.string()),
        ("status", pa.string()),
        ("chosen_option", pa.int32()),
        ("probabilities", pa.list_(pa.float64())),
        ("defer_probability", pa.float64()),
        ("raw_favourite_infeasible", pa.bool_()),
        ("agrees_with_production", pa.bool_()),
        ("feature_version", pa.string()),
        ("feature_hash", pa.string()),
        # the request's per-option feasibility as the scorer logged it: one uint16 per
        # option, bit i = signal i of `feasibility_version` (names: _slice.json
        # "feasibility_signals"); both null when not logged (before migration 0010)
        ("feasibility_version", pa.string()),
        ("feasibility_bits", pa.list_(pa.uint16())),
        ("traffic", pa.string()),
        ("scenario", pa.string()),
        ("date", pa.string()),
        ("policy", pa.string()),
    ],
    metadata={SCHEMA_KEY: SCHEMA_VERSION.encode()},
)
"""The full row schema; ``date`` and ``policy`` live in the directory names, not the files."""


@dataclass(frozen=True, slots=True)
class SliceTags:
    """Labels stamped on every row: what produced the traffic, and the scenario if known."""

    traffic: str = "production"
    scenario: str | None = None


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote.

    Attributes:
        rows: decision rows written.
        rounds: joined requests (distinct ``seq``).
        dates, policies: partition values written, sorted.
        files: data files written.
        bytes: their total size.
        seconds: wall time of the read and write.
    """

    rows: int
    rounds: int
    dates: tuple[str, ...]
    policies: tuple[str, ...]
    files: int
    bytes: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        """Export rate."""
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def _micros(column: Any) -> Any:
    # PostgreSQL's epoch is exact numeric: times 1e6 it is the integer microsecond.
    return cast(extract("epoch", column) * 1_000_000, BigInteger)


def slice_query(where: OpeFilter) -> tuple[Any, Any]:
    """``(count, rows)`` statements for the slice, rows in OPE's read order."""
    r, o, d = t.requests, t.outcomes, t.decisions
    conditions = filter_conditions(where)
    count = select(func.count()).select_from(joined_source()).where(*conditions)
    rows = (
        select(
            r.c.request_id,
            _micros(r.c.request_time),
            _micros(r.c.received_at),
            r.c.workload_id,
            r.c.workload_kind,
            r.c.tenant,
            r.c.model_family,
            r.c.n_options,
            r.c.production_option,
            r.c.production_propensity,
            r.c.production_source,
            _micros(o.c.observed_at),
            o.c.queue_delay_s,
            o.c.throughput,
            o.c.completion_time_s,
            o.c.slo_met,
            o.c.failure,
            d.c.policy_version,
            d.c.status,
            d.c.chosen_option,
            d.c.probabilities_f64,
            d.c.defer_probability,
            d.c.raw_favourite_infeasible,
            d.c.agrees_with_production,
            r.c.feature_version,
            r.c.feature_hash,
            d.c.policy_name,
            r.c.production_probabilities_f64,
            r.c.feasibility_version,
            r.c.feasibility_bits,
            r.c.qos_class,
        )
        .select_from(joined_source())
        .where(*conditions)
        .order_by(r.c.received_at, r.c.request_id, d.c.policy_name, d.c.policy_version)
    )
    return count, rows


_DIRECT = (
    "request_id",
    "request_time",
    "received_at",
    "workload_id",
    "workload_kind",
    "tenant",
    "model_family",
    "n_options",
    "production_option",
    "production_propensity",
    "production_source",
    "observed_at",
    "queue_delay_s",
    "throughput",
    "completion_time_s",
    "slo_met",
    "failure",
    "policy_version",
    "status",
    "chosen_option",
)
"""Query columns 0..19, copied as they come."""


def _probabilities(blobs: Sequence[bytes]) -> pa.ListArray:
    """The ``probabilities_f64`` blobs (little-endian float64) as one list column."""
    lengths = np.fromiter((len(b) // 8 for b in blobs), dtype=np.int32, count=len(blobs))
    offsets = np.zeros(len(blobs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.frombuffer(b"".join(blobs), dtype="<f8").astype(np.float64)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _optional_probabilities(blobs: Sequence[bytes | None]) -> pa.ListArray:
    """Nullable ``float64`` blobs as one list column (null where the blob is NULL)."""
    lists = _probabilities([b or b"" for b in blobs])
    mask = pa.array([b is None for b in blobs], type=pa.bool_())
    return pa.ListArray.from_arrays(lists.offsets, lists.values, mask=mask)


def _feasibility_bits(blobs: Sequence[bytes | None]) -> pa.ListArray:
    """``requests.feasibility_bits`` (little-endian uint16 per option) as a nullable list column."""
    present = [bytes(b) if b is not None else b"" for b in blobs]
    lengths = np.fromiter((len(b) // 2 for b in present), dtype=np.int32, count=len(present))
    offsets = np.zeros(len(present) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.frombuffer(b"".join(present), dtype="<u2").astype(np.uint16)
    mask = pa.array([b is None for b in blobs], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=mask)


def _dates(micros: pa.Array) -> pa.Array:
    days = np.asarray(micros.to_numpy(zero_copy_only=False), dtype=np.int64) // 86_400_000_000
    return pa.array(days.astype("datetime64[D]").astype(str))


class _Sequencer:
    """Numbers rounds across chunks: ``seq`` grows by one whenever the request changes."""

    def __init__(self) -> None:
        self.next = 0
        self.last: str | None = None

    def number(self, ids: Sequence[str]) -> NDArray[np.int64]:
        out = np.empty(len(ids), dtype=np.int64)
        for i, request_id in enumerate(ids):
            if request_id != self.last:
                self.last = request_id
                self.next += 1
            out[i] = self.next - 1
        return out


def _batch(rows: Sequence[Any], seq: _Sequencer, tags: SliceTags) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays: dict[str, pa.Array] = {"seq": pa.array(seq.number(columns[0]))}
    for i, name in enumerate(_DIRECT):
        arrays[name] = pa.array(columns[i], type=SLICE_SCHEMA.field(name).type)
    arrays["probabilities"] = _probabilities(columns[20])
    arrays["defer_probability"] = pa.array(columns[21], type=pa.float64())
    arrays["raw_favourite_infeasible"] = pa.array(columns[22], type=pa.bool_())
    arrays["agrees_with_production"] = pa.array(columns[23], type=pa.bool_())
    arrays["feature_version"] = pa.array(columns[24], type=pa.string())
    arrays["feature_hash"] = pa.array(columns[25], type=pa.string())
    arrays["traffic"] = pa.array([tags.traffic] * len(rows), type=pa.string())
    arrays["scenario"] = pa.array([tags.scenario] * len(rows), type=pa.string())
    arrays["date"] = _dates(pa.array(columns[2], type=pa.int64()))
    arrays["policy"] = pa.array(columns[26], type=pa.string())
    arrays["production_probabilities"] = _optional_probabilities(columns[27])
    arrays["feasibility_version"] = pa.array(columns[28], type=pa.string())
    arrays["feasibility_bits"] = _feasibility_bits(columns[29])
    arrays["qos_class"] = pa.array(columns[30], type=pa.string())
    return pa.RecordBatch.from_arrays([arrays[f.name] for f in SLICE_SCHEMA], schema=SLICE_SCHEMA)


def iter_slice(
    engine: Engine,
    where: OpeFilter | None = None,
    *,
    tags: SliceTags = SliceTags(),
    batch_rows: int = 20_000,
    progress: Progress | None = None,
) -> Iterator[pa.RecordBatch]:
    """The slice as record batches of at most `batch_rows` rows, in OPE's read order."""
    count, query = slice_query(where or OpeFilter())
    seq = _Sequencer()
    with unavailable_on_failure("exporting the decision log"), engine.connect() as conn:
        total = int(conn.execute(count).scalar_one())
        if progress is not None:
            progress(0, total)
        read = 0
        result = conn.execution_options(stream_results=True, yield_per=batch_rows).execute(query)
        for chunk in result.partitions():
            yield _batch(chunk, seq, tags)
            read += len(chunk)
            if progress is not None:
                progress(read, total)


def write_parquet(
    batches: Iterator[pa.RecordBatch],
    out: Path,
    *,
    manifest: dict[str, Any] | None = None,
    max_rows_per_group: int = 64 * 1024,
) -> ExportSummary:
    """Write `batches` (`SLICE_SCHEMA`) under `out` as Hive-partitioned Parquet.

    `out` must not exist or be empty. Writes ``_slice.json`` last, so a folder
    with a manifest is a complete slice.
    """
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    start = time.perf_counter()
    counted = _Counter(batches)
    written: list[ds.WrittenFile] = []
    ds.write_dataset(
        counted,
        out,
        schema=SLICE_SCHEMA,
        format="parquet",
        partitioning=ds.partitioning(PARTITION_FIELDS, flavor="hive"),
        basename_template="part-{i}.parquet",
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        max_rows_per_group=max_rows_per_group,
        min_rows_per_group=min(max_rows_per_group, 16 * 1024),
        existing_data_behavior="overwrite_or_ignore",
        preserve_order=True,
        file_visitor=written.append,
    )
    out.mkdir(parents=True, exist_ok=True)
    summary = ExportSummary(
        rows=counted.rows,
        rounds=counted.rounds,
        dates=tuple(sorted(counted.dates)),
        policies=tuple(sorted(counted.policies)),
        files=len(written),
        bytes=sum(int(w.size) for w in written),
        seconds=time.perf_counter() - start,
    )
    body = {"schema": SCHEMA_VERSION, **(manifest or {}), "summary": asdict(summary)}
    (out / MANIFEST).write_text(json.dumps(body, indent=2))
    return summary


class _Counter:
    """Passes record batches through, counting rows, rounds and partition values."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self.rows = 0
        self.rounds = 0
        self._last_seq = -1
        self.dates: set[str] = set()
        self.policies: set[str] = set()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            if batch.num_rows:
                seq = batch.column("seq").to_numpy()
                self.rounds += len(np.unique(seq[seq > self._last_seq]))
                self._last_seq = int(seq.max())
                self.dates.update(batch.column("date").unique().to_pylist())
                self.policies.update(batch.column("policy").unique().to_pylist())
                self.rows += batch.num_rows
            yield batch


def export_parquet(
    engine: Engine,
    where: OpeFilter,
    out: Path,
    *,
    tags: SliceTags = SliceTags(),
    batch_rows: int = 20_000,
    progress: Progress | None = None,
) -> ExportSummary:
    """Export the slice `where` of the log to `out` (see the module docstring)."""
    manifest = {
        "filter": asdict(where),
        "traffic": tags.traffic,
        "scenario": tags.scenario,
        "exported_at": time.time(),
        "feasibility_signals": SIGNALS_BY_VERSION,
    }
    batches = iter_slice(engine, where, tags=tags, batch_rows=batch_rows, progress=progress)
    return write_parquet(batches, out, manifest=manifest)
