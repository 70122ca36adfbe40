"""The canonical encoding of a chained row (a decision, an outcome, a request), its hash, heads.

A row is encoded as PostgreSQL's binary COPY tuple of its chain's fields
(`ChainSpec.fields`), in that order: a big-endian int16 field count, then per
field a big-endian int32 length (-1 for NULL, no bytes follow) and the type's
binary send form — text as UTF-8, int4/int8 big-endian, float8 IEEE-754
big-endian, bool one byte, bytea raw, timestamptz int64 microseconds since
2000-01-01 UTC, jsonb a version byte (1) and its normalised text. It is the
server's own, documented wire format (``COPY ... TO STDOUT (FORMAT BINARY)``),
so the sealer and the verifier hash exactly the stored values without decoding
them, and an edit of any covered column — a probability's last bit included —
changes the hash.

    row_hash   = sha256(<chain's row domain> || tuple)
    genesis(d) = sha256("understudy.genesis.v1\\0" || <chain prefix> || d.isoformat())
    head_n     = sha256("understudy.block.v1\\0" || d.isoformat() || int32 n
                        || int64 first_position || head_{n-1} || row_hash...)

A chain may gain columns after rows were sealed (`ChainSpec.later`: the
requests' contract-v2 columns of migration 0010). A row whose later fields are
all NULL is hashed exactly as before they existed, so every row sealed before
the migration still verifies; a row with any of them set is hashed with them,
placed before the order key, under the chain's `ChainSpec.later_domain`. An
edit that sets or clears one changes the bytes hashed either way, and the two
forms never share a domain, so none passes for the other.

The decisions chain has the empty prefix (its heads are those of before the
other chains existed); outcomes and requests have ``outcomes:`` and
``requests:``, so a block of one chain never passes for a block of another.
The day, block number and first position are inside each head, so a block
cannot be relabelled or moved; ``head_{-1}`` is the day's genesis.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, timedelta


@dataclass(frozen=True)
class ChainField:
    """One hashed field: its name, the SQL expression read, its binary send function."""

    name: str
    send: str
    expr: str = ""
    """SQL over the row; empty: the column `name` itself."""

    @property
    def sql(self) -> str:
        """The expression to select."""
        return self.expr or self.name


@dataclass(frozen=True)
class ChainSpec:
    """One chained table: what is hashed, where its blocks live, how a row is named.

    The last two fields are always ``chain_xid`` and ``chain_seq`` (the order key).
    """

    name: str
    """The chain's name: its table, its ``decision_chain_state`` row, its anchor tag."""
    blocks_table: str
    fields: tuple[ChainField, ...]
    row_domain: bytes
    genesis_prefix: str
    covered_elsewhere: frozenset[str] = frozenset()
    """Columns not hashed as themselves but held by the chain another way (see `covers`)."""
    policy_fields: tuple[int, int] | None = None
    """Indexes of the policy name and version fields (decisions only)."""
    later: tuple[ChainField, ...] = ()
    """Fields added after rows were sealed: hashed only on rows that set one (module doc)."""
    later_domain: bytes = b""
    """The row domain of a row hashed with its `later` fields."""

    @property
    def covers(self) -> frozenset[str]:
        """The table's columns the chain covers (verify reports any other column): every
        field read as a plain column, and `covered_elsewhere`."""
        plain = frozenset(f.name for f in (*self.fields, *self.later) if not f.expr)
        return plain | self.covered_elsewhere

    @property
    def read_fields(self) -> tuple[ChainField, ...]:
        """What a row is read as: `fields` with the `later` ones before the order key."""
        if not self.later:
            return self.fields
        return (*self.fields[:-2], *self.later, *self.fields[-2:])

    @property
    def table(self) -> str:
        """The chained table."""
        return self.name

    @property
    def columns(self) -> tuple[str, ...]:
        """The field names, in encoding order."""
        return tuple(f.name for f in self.fields)


def _fields(
    pairs: Sequence[tuple[str, str]], computed: Sequence[ChainField] = ()
) -> tuple[ChainField, ...]:
    """Plain columns, then `computed` fields, then the order key every chain ends with."""
    tail = (ChainField("chain_xid", "int8send"), ChainField("chain_seq", "int8send"))
    return (*(ChainField(n, s) for n, s in pairs), *computed, *tail)


_DECISION_FIELDS = _fields(
    [
        ("request_id", "textsend"),
        ("request_time", "timestamptz_send"),
        ("policy_name", "textsend"),
        ("policy_version", "textsend"),
        ("status", "textsend"),
        ("chosen_option", "int4send"),
        ("chosen_probability", "float8send"),
        ("production_probability", "float8send"),
        ("defer_probability", "float8send"),
        ("scores_f32", "byteasend"),
        ("probabilities_f64", "byteasend"),
        ("predicted", "jsonb_send"),
        ("raw_favourite_infeasible", "boolsend"),
        ("agrees_with_production", "boolsend"),
        ("latency_us", "int8send"),
        ("error", "textsend"),
        ("scored_at", "timestamptz_send"),
    ]
)

DECISIONS = ChainSpec(
    name="decisions",
    blocks_table="decision_chain_blocks",
    fields=_DECISION_FIELDS,
    row_domain=b"understudy.decision.v1\x00",
    genesis_prefix="",
    policy_fields=(2, 3),
)

_OUTCOME_FIELDS = _fields(
    [
        ("request_id", "textsend"),
        ("request_time", "timestamptz_send"),
        ("observed_at", "timestamptz_send"),
        ("received_at", "timestamptz_send"),
        ("queue_delay_s", "float8send"),
        ("throughput", "float8send"),
        ("completion_time_s", "float8send"),
        ("slo_met", "boolsend"),
        ("failure", "textsend"),
        ("production_option", "int4send"),
        ("production_propensity", "float8send"),
        ("journal_seq", "int8send"),
        ("join_state", "textsend"),
        ("joined_at", "timestamptz_send"),
    ]
)

OUTCOMES = ChainSpec(
    name="outcomes",
    blocks_table="outcome_chain_blocks",
    fields=_OUTCOME_FIELDS,
    row_domain=b"understudy.outcome.v1\x00",
    genesis_prefix="outcomes:",
)

_REQUEST_FIELDS = _fields(
    [
        ("request_id", "textsend"),
        ("request_time", "timestamptz_send"),
        ("received_at", "timestamptz_send"),
        ("journal_seq", "int8send"),
        ("schema_version", "int4send"),
        ("workload_id", "textsend"),
        ("workload_kind", "textsend"),
        ("tenant", "textsend"),
        ("model_family", "textsend"),
        ("accelerators_requested", "int4send"),
        ("priority", "int4send"),
        ("n_options", "int4send"),
        ("n_nodes", "int4send"),
        ("snapshot_hash", "byteasend"),
        ("state_offset", "int4send"),
        ("payload_zstd", "byteasend"),
        ("feature_version", "textsend"),
        ("feature_hash", "textsend"),
    ],
    (
        # Production's decision as Runtime mirrored it never changes after the insert; one
        # filled later from the outcome does (source 'outcome', or a propensity the mirror
        # lacked), so it is held to the chained outcome by `verify` instead (chain_verify).
        ChainField(
            "mirrored_production", "boolsend", "(production_source IS NOT DISTINCT FROM 'mirror')"
        ),
        ChainField(
            "mirrored_option",
            "int4send",
            "(CASE WHEN production_source = 'mirror' THEN production_option END)",
        ),
    ),
)

REQUESTS = ChainSpec(
    name="requests",
    blocks_table="request_chain_blocks",
    fields=_REQUEST_FIELDS,
    row_domain=b"understudy.request.v1\x00",
    genesis_prefix="requests:",
    covered_elsewhere=frozenset(
        {"production_option", "production_propensity", "production_source"}
    ),
    # Contract v2 (migration 0010); written with the row, never updated afterwards.
    later=(
        ChainField("feasibility_version", "textsend"),
        ChainField("feasibility_bits", "byteasend"),
        ChainField("production_probabilities_f64", "byteasend"),
        ChainField("qos_class", "textsend"),
    ),
    later_domain=b"understudy.request.v2\x00",
)

CHAINS: tuple[ChainSpec, ...] = (REQUESTS, DECISIONS, OUTCOMES)
"""Every chain, in the order a seal and `verify` read them: the order in which
``understudy_ensure_partitions`` locks their tables, so a seal or a verification
and a partition being created never wait for each other in a cycle (deadlock)."""
BY_NAME = {c.name: c for c in CHAINS}

CHAIN_COLUMNS: tuple[str, ...] = DECISIONS.columns
"""Every column of ``decisions``, in encoding order (verify checks none is missing)."""

ROW_DOMAIN = DECISIONS.row_domain
BLOCK_DOMAIN = b"understudy.block.v1\x00"
GENESIS_DOMAIN = b"understudy.genesis.v1\x00"
HASH_BYTES = 32

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_PG_EPOCH = date(2000, 1, 1)
_US_PER_DAY = 86_400_000_000
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_I_REQUEST_ID, _I_TIME = 0, 1


@dataclass(frozen=True, slots=True)
class ChainRow:
    """One chained row as the chain sees it: its hash, its day and order key, who it is."""

    row_hash: bytes
    day: date
    chain_xid: int
    chain_seq: int
    request_id: str
    policy: str
    """``name@version`` for a decision; empty for an outcome or a request."""


def genesis(day: date, spec: ChainSpec = DECISIONS) -> bytes:
    """The head before a day's first block of `spec`'s chain."""
    return hashlib.sha256(
        GENESIS_DOMAIN + (spec.genesis_prefix + day.isoformat()).encode()
    ).digest()


def block_head(
    day: date, block: int, first_position: int, prev_head: bytes, row_hashes: Iterable[bytes]
) -> bytes:
    """``head_n`` of the module docstring."""
    h = hashlib.sha256(BLOCK_DOMAIN)
    h.update(day.isoformat().encode())
    h.update(_INT32.pack(block))
    h.update(_INT64.pack(first_position))
    h.update(prev_head)
    for row_hash in row_hashes:
        h.update(row_hash)
    return h.digest()


def _field_sql(f: ChainField) -> str:
    send = f"{f.send}({f.sql})"
    return (
        f"CASE WHEN {f.sql} IS NULL THEN '\\xffffffff'::bytea "
        f"ELSE int4send(octet_length({send})) || {send} END"
    )


def _hash_sql(domain: bytes, fields: Sequence[ChainField]) -> str:
    return (
        f"sha256('\\x{domain.hex()}{len(fields):04x}'::bytea || "
        + " || ".join(_field_sql(f) for f in fields)
        + ")"
    )


def row_hash_sql(spec: ChainSpec) -> str:
    """The row hash computed by PostgreSQL from the same encoding (the sealer's fast path).

    The sealer lets the server hash (no row leaves it); the verifier hashes the
    binary COPY bytes itself, so the two implementations check each other: a
    difference between them fails verification of every row. With `ChainSpec.later`
    fields, a row that sets none is hashed in the earlier form (module docstring).
    """
    base = _hash_sql(spec.row_domain, spec.fields)
    if not spec.later:
        return base
    unset = " AND ".join(f"{f.sql} IS NULL" for f in spec.later)
    later = _hash_sql(spec.later_domain, spec.read_fields)
    return f"(CASE WHEN {unset} THEN {base} ELSE {later} END)"


ROW_HASH_SQL = row_hash_sql(DECISIONS)
"""`row_hash_sql` of the decisions chain."""


def copy_sql(where: str, limit: int | None = None, spec: ChainSpec = DECISIONS) -> str:
    """``COPY (SELECT <chain fields> ... WHERE <where> ORDER BY chain order) TO STDOUT``."""
    cols = ", ".join(f.sql for f in spec.read_fields)
    tail = " ORDER BY chain_xid, chain_seq" + (f" LIMIT {int(limit)}" if limit else "")
    return f"COPY (SELECT {cols} FROM {spec.table} WHERE {where}{tail}) TO STDOUT (FORMAT BINARY)"


def _row_hash(tup: bytes | bytearray, spans: Sequence[tuple[int, int]], spec: ChainSpec) -> bytes:
    """The row hash of a tuple read with `ChainSpec.read_fields` (see the module docstring).

    A row that sets no `later` field is hashed as the tuple of `fields` alone: the
    same bytes without the later fields' NULL markers, with the earlier count.
    """
    if not spec.later:
        return hashlib.sha256(spec.row_domain + tup).digest()
    first = len(spec.fields) - 2
    if any(n >= 0 for _, n in spans[first : first + len(spec.later)]):
        return hashlib.sha256(spec.later_domain + tup).digest()
    cut, resume = spans[first][0] - 4, spans[first + len(spec.later)][0] - 4
    h = hashlib.sha256(spec.row_domain)
    h.update(_INT16.pack(len(spec.fields)))
    h.update(tup[2:cut])
    h.update(tup[resume:])
    return h.digest()


def _decode(tup: bytes | bytearray, spans: Sequence[tuple[int, int]], spec: ChainSpec) -> ChainRow:
    def text_at(i: int) -> str:
        start, n = spans[i]
        return bytes(tup[start : start + n]).decode() if n >= 0 else ""

    t_start, _ = spans[_I_TIME]
    us = _INT64.unpack_from(tup, t_start)[0]
    xid_start, _ = spans[-2]
    seq_start, _ = spans[-1]
    policy = ""
    if spec.policy_fields is not None:
        name, version = spec.policy_fields
        policy = f"{text_at(name)}@{text_at(version)}"
    return ChainRow(
        row_hash=_row_hash(tup, spans, spec),
        day=_PG_EPOCH + timedelta(days=us // _US_PER_DAY),
        chain_xid=_INT64.unpack_from(tup, xid_start)[0],
        chain_seq=_INT64.unpack_from(tup, seq_start)[0],
        request_id=text_at(_I_REQUEST_ID),
        policy=policy,
    )


class CopyDecoder:
    """Splits a binary COPY stream of a chain's fields into `ChainRow`s, chunk by chunk."""

    def __init__(self, spec: ChainSpec = DECISIONS) -> None:
        self._spec = spec
        self._n = len(spec.read_fields)
        self._buf = bytearray()
        self._header_done = False
        self.finished = False

    def feed(self, chunk: bytes | bytearray | memoryview) -> Iterator[ChainRow]:
        """Rows completed by `chunk` (a chunk may end mid-row; the rest is kept)."""
        self._buf += chunk
        buf = self._buf
        n_fields = self._n
        pos = 0
        if not self._header_done:
            if len(buf) < 19:
                return
            if bytes(buf[:11]) != _COPY_SIGNATURE:
                raise ValueError("not a binary COPY stream")
            pos = 19 + _INT32.unpack_from(buf, 15)[0]
            self._header_done = True
        try:
            while len(buf) - pos >= 2:
                count = _INT16.unpack_from(buf, pos)[0]
                if count == -1:
                    self.finished = True
                    pos += 2
                    break
                if count != n_fields:
                    raise ValueError(f"expected {n_fields} fields per row, got {count}")
                cursor = pos + 2
                spans: list[tuple[int, int]] = []
                complete = True
                for _ in range(n_fields):
                    if len(buf) - cursor < 4:
                        complete = False
                        break
                    n = _INT32.unpack_from(buf, cursor)[0]
                    cursor += 4
                    spans.append((cursor - pos, n))
                    if n > 0:
                        cursor += n
                if not complete or cursor > len(buf):
                    break
                yield _decode(buf[pos:cursor], spans, self._spec)
                pos = cursor
        finally:
            del buf[:pos]
