"""What a reviewer may ask of the decision log: filters, limits, and the opaque cursor.

Every value arrives as text (an HTTP query string, a CLI flag) and is
checked here before any SQL exists: an unknown status, a malformed time, a
NUL character, an over-long string, a limit out of range or a cursor that was
not issued for this query raises `InvalidInput` naming the parameter. What
passes becomes typed values that the reads bind as parameters — nothing is
ever formatted into SQL.

Keyset pagination: decisions are ordered by their primary key
``(request_time, request_id, policy_name, policy_version)`` (unique, so a total
order), and a page continues strictly after the last key of the previous one.
Rows committed between pages cannot shift what comes next, so every row that
existed when paging began is returned exactly once. The cursor is that key
(request time in integer microseconds, exactly as PostgreSQL stores it) plus
the order and a digest of the filters, JSON in unpadded base64url: opaque to
clients, and refused when replayed against other filters.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from service.contract import WorkloadKind
from service.contract.errors import InvalidInput

DECISION_STATUSES: tuple[str, ...] = (
    "ok",
    "all_infeasible",
    "infeasible_choice",
    "error",
    "timeout",
)
"""``decisions.status`` values (the migration's CHECK constraint)."""
ORDERS: tuple[str, ...] = ("asc", "desc")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_TEXT = 256
"""Longest accepted text filter (ids, names and classes are at most 256 characters)."""
MAX_CURSOR = 2048
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_UNIX_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z, as the contract's validator
MAX_KEY_US = 253_402_300_799_999_999
"""Latest request time a cursor may carry (9999-12-31T23:59:59.999999Z), in microseconds."""
MAX_KEY_TEXT = 512
"""Longest id or name a cursor may carry (what the contract and the registry accept)."""
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")

DECISION_PARAMETERS: tuple[str, ...] = (
    "since",
    "until",
    "policy",
    "policy_version",
    "experiment",
    "experiment_version",
    "workload_kind",
    "hardware_class",
    "disagreement",
    "status",
    "order",
    "limit",
    "cursor",
)
"""Query parameters of a decision listing (transports may add e.g. ``format``)."""


@dataclass(frozen=True, slots=True)
class DecisionFilter:
    """Which decisions: every set field must hold (None = any).

    Attributes:
        since, until: ``request_time`` (Runtime's clock) in ``[since, until)``.
        policy, policy_version: the policy's registry name and version.
        experiment, experiment_version: the candidate's decisions on requests
            received while that protocol version ran (latest version if None).
        workload_kind: ``train``, ``finetune``, ``infer`` or ``batch``.
        hardware_class: the class of a node of the option the policy chose.
        disagreement: True = only decisions that differ from production's,
            False = only those that agree (decisions without production's are neither).
        status: ``ok``, ``all_infeasible``, ``infeasible_choice``, ``error`` or ``timeout``.
    """

    since: datetime | None = None
    until: datetime | None = None
    policy: str | None = None
    policy_version: str | None = None
    experiment: str | None = None
    experiment_version: int | None = None
    workload_kind: str | None = None
    hardware_class: str | None = None
    disagreement: bool | None = None
    status: str | None = None

    def digest(self, order: str) -> str:
        """A short digest of the filters and order, carried in the cursor."""
        material = json.dumps([order, *map(_jsonable, astuple(self))])
        return hashlib.sha256(material.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class DecisionKey:
    """A decision's primary key in page order; ``request_time_us`` is microseconds."""

    request_time_us: int
    request_id: str
    policy_name: str
    policy_version: str

    @property
    def request_time(self) -> datetime:
        """The request time as PostgreSQL holds it (microsecond precision)."""
        return EPOCH + timedelta(microseconds=self.request_time_us)


@dataclass(frozen=True, slots=True)
class DecisionQuery:
    """A page request: filters, order, page size and where the previous page ended."""

    filter: DecisionFilter
    order: str = "asc"
    limit: int = DEFAULT_LIMIT
    after: DecisionKey | None = None


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def microseconds(when: datetime) -> int:
    """`when` as integer microseconds since the Unix epoch (exact)."""
    return (when - EPOCH) // timedelta(microseconds=1)


def check_text(field: str, value: str, limit: int = MAX_TEXT) -> str:
    """`value` if it is non-empty, at most `limit` characters and free of NUL."""
    if not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > limit:
        raise InvalidInput(field, f"must be at most {limit} characters, got {len(value)}")
    if "\x00" in value:
        raise InvalidInput(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(field, "must be valid Unicode text (no lone surrogates)") from None
    return value


def parse_time(field: str, value: str) -> datetime:
    """Unix seconds or ISO 8601 with a UTC offset (``2026-05-01T00:00:00Z``)."""
    check_text(field, value, 64)
    try:
        seconds = float(value)
    except ValueError:
        return _parse_iso(field, value)
    if not (math.isfinite(seconds) and 0 <= seconds <= _MAX_UNIX_S):
        raise InvalidInput(field, f"must be Unix seconds in [0, {_MAX_UNIX_S:.0f}], got {value!r}")
    return EPOCH + timedelta(microseconds=round(seconds * 1e6))


def _parse_iso(field: str, value: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(
            field, f"must be Unix seconds or ISO 8601 with an offset, got {value!r}"
        ) from None
    if when.tzinfo is None:
        raise InvalidInput(field, f"must carry a UTC offset (e.g. `Z`), got {value!r}")
    try:
        return when.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(field, f"is out of range, got {value!r}") from None


def parse_int(field: str, value: str, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]``."""
    check_text(field, value, 20)
    if not re.fullmatch(r"-?[0-9]+", value.strip()):
        raise InvalidInput(field, f"must be an integer in [{lo}, {hi}], got {value!r}")
    number = int(value)
    if not lo <= number <= hi:
        raise InvalidInput(field, f"must be an integer in [{lo}, {hi}], got {number}")
    return number


def parse_bool(field: str, value: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``)."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidInput(field, f"must be `true` or `false`, got {value[:40]!r}")


def parse_choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    """One of `allowed`, exactly."""
    if value not in allowed:
        raise InvalidInput(field, f"must be one of {', '.join(allowed)}, got {value[:40]!r}")
    return value


def encode_cursor(key: DecisionKey, order: str, digest: str) -> str:
    """The opaque cursor that continues after `key`."""
    body = {"v": 1, "o": order, "f": digest, "k": list(astuple(key))}
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _check_key(key: object) -> DecisionKey:
    """A cursor's key, if every part is one the log can hold (see `decode_cursor`)."""
    if not (isinstance(key, list) and len(key) == 4):
        raise InvalidInput("cursor", "is not a cursor this API issued; start again without it")
    when, *names = key
    if type(when) is not int:
        raise InvalidInput("cursor", "is not a cursor this API issued: its time is not an integer")
    if not 0 <= when <= MAX_KEY_US:
        raise InvalidInput(
            "cursor",
            f"is not a cursor this API issued: its time {str(when)[:40]} µs is outside "
            f"[0, {MAX_KEY_US}] (1970 to 9999); start again without it",
        )
    for part, name in zip(("request_id", "policy_name", "policy_version"), names, strict=True):
        if not isinstance(name, str):
            raise InvalidInput("cursor", f"is not a cursor this API issued: its {part} is no text")
        try:
            check_text(part, name, MAX_KEY_TEXT)
        except InvalidInput as exc:
            raise InvalidInput(
                "cursor", f"is not a cursor this API issued: its {exc}; start again without it"
            ) from None
    return DecisionKey(when, names[0], names[1], names[2])


def decode_cursor(value: str, order: str, digest: str) -> DecisionKey:
    """The key a cursor continues after; `InvalidInput` on ``cursor`` if it is not ours.

    Cursors are opaque but not secret (base64url JSON, the digest is a plain
    hash), so one can be crafted: every part of the key is checked against what
    the log can hold — a time in integer microseconds within the contract's
    range (an out-of-range one once overflowed into a 500), texts non-empty,
    bounded, without NUL or lone surrogates — before it is bound to any SQL.
    """
    check_text("cursor", value, MAX_CURSOR)
    bad = InvalidInput("cursor", "is not a cursor this API issued; start again without it")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        body = json.loads(raw.decode())
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        raise bad from None
    if not isinstance(body, dict) or type(body.get("v")) is not int or body.get("v") != 1:
        raise bad
    key = _check_key(body.get("k"))
    if body.get("o") != order or body.get("f") != digest:
        raise InvalidInput(
            "cursor", "belongs to a query with other filters or order; start again without it"
        )
    return key


def parse_decision_query(params: Mapping[str, str]) -> DecisionQuery:
    """Check every decision-listing parameter; unknown names are refused.

    Raises:
        InvalidInput: naming the first offending parameter.
    """
    for name in params:
        if name not in DECISION_PARAMETERS:
            raise InvalidInput(
                name[:40], f"is not a parameter; use one of {', '.join(DECISION_PARAMETERS)}"
            )
    get = params.get
    text = {
        name: check_text(name, value)
        for name in ("policy", "policy_version", "experiment", "hardware_class")
        if (value := get(name)) is not None
    }
    since = parse_time("since", v) if (v := get("since")) is not None else None
    until = parse_time("until", v) if (v := get("until")) is not None else None
    if since is not None and until is not None and until <= since:
        raise InvalidInput("until", f"must be later than `since` ({since.isoformat()})")
    kinds = tuple(k.value for k in WorkloadKind)
    flt = DecisionFilter(
        since=since,
        until=until,
        policy=text.get("policy"),
        policy_version=text.get("policy_version"),
        experiment=text.get("experiment"),
        experiment_version=(
            parse_int("experiment_version", v, 1, 2**31 - 1)
            if (v := get("experiment_version")) is not None
            else None
        ),
        workload_kind=(
            parse_choice("workload_kind", v, kinds)
            if (v := get("workload_kind")) is not None
            else None
        ),
        hardware_class=text.get("hardware_class"),
        disagreement=parse_bool("disagreement", v)
        if (v := get("disagreement")) is not None
        else None,
        status=parse_choice("status", v, DECISION_STATUSES)
        if (v := get("status")) is not None
        else None,
    )
    if flt.experiment_version is not None and flt.experiment is None:
        raise InvalidInput("experiment_version", "needs `experiment`")
    order = parse_choice("order", v, ORDERS) if (v := get("order")) is not None else "asc"
    limit = (
        parse_int("limit", v, 1, MAX_LIMIT) if (v := get("limit")) is not None else DEFAULT_LIMIT
    )
    cursor = get("cursor")
    after = decode_cursor(cursor, order, flt.digest(order)) if cursor is not None else None
    return DecisionQuery(filter=flt, order=order, limit=limit, after=after)
