"""Reading one column of a batch message: a checked, read-only numpy view (issue 24).

Each reader takes a column's bytes, the count its rows need and the wire path
to name, and either returns the column viewed in place (``np.frombuffer``: no
copy, no Python loop over values) or raises `InvalidInput` naming that path.
They check only what makes a column readable at all (byte length, count, CSR
layout, flag bytes, UTF-8); content is the validator's. `service.wire.batch_codec`
composes them into whole messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import Strings
from service.contract.csr import check_offsets
from service.contract.errors import InvalidInput, MalformedMessage
from service.wire.understudy.v1 import batch_pb2

U8, I32, U32, I64, F32, F64 = "<u1", "<i4", "<u4", "<i8", "<f4", "<f8"
NAME = {U8: "u8", I32: "i32", U32: "u32", I64: "i64", F32: "f32", F64: "f64"}
_INT32_MAX = 2**31 - 1


def view(field: str, data: bytes, dtype: str) -> NDArray[Any]:
    """The column as a read-only array over the message's bytes."""
    size = np.dtype(dtype).itemsize
    if len(data) % size:
        raise InvalidInput(
            field,
            f"must be a whole number of {NAME[dtype]} values ({size} bytes each), "
            f"got {len(data)} bytes",
        )
    return np.frombuffer(data, dtype=dtype)


def as_dtype(array: NDArray[Any], dtype: type[Any]) -> NDArray[Any]:
    """`array` in the dataclass's dtype: the view itself where they agree (a
    little-endian host), else a read-only copy."""
    if array.dtype == dtype:
        return array
    out = array.astype(dtype)
    out.flags.writeable = False
    return out


def column(
    field: str, data: bytes, dtype: str, n: int, per: str, optional: bool = False
) -> NDArray[Any]:
    """A numeric column of exactly `n` values (or none, where `optional`)."""
    array = view(field, data, dtype)
    if len(array) != n and not (optional and not len(array)):
        either = " or none" if optional else ""
        raise InvalidInput(
            field, f"must hold one {NAME[dtype]} {per} ({n}){either}, got {len(array)}"
        )
    return array


def flags(field: str, data: bytes, n: int, per: str, optional: bool = True) -> NDArray[np.bool_]:
    """A u8 0/1 column as bool (a view). Any other byte would read as True in one place
    and as a number in another, so it refuses the batch."""
    array = column(field, data, U8, n, per, optional)
    if len(array) and np.maximum.reduce(array) > 1:
        bad = int(np.flatnonzero(array > 1)[0])
        raise InvalidInput(f"{field}[{bad}]", f"must be 0 or 1, got {array[bad]}")
    return array.view(np.bool_)


def index32(array: NDArray[np.uint32]) -> NDArray[Any]:
    """A u32 hardware index column as int32. An index beyond int32 (always out of range:
    no message holds 2**31 classes) stays int64, so the validator refuses it naming the
    value as sent, as `node_hardware_array` does for a single request, not a wrapped one."""
    if len(array) and np.maximum.reduce(array) > _INT32_MAX:
        return as_dtype(array, np.int64)
    return as_dtype(array, np.int32)


def csr(
    field: str,
    data: bytes,
    n_rows: int | None,
    n_values: int,
    values: str,
    rows: str,
    optional: bool = False,
) -> NDArray[np.int64]:
    """An i64 offsets column indexing `n_values` values over `n_rows` rows (None: as many
    rows as the column says). Empty stands for "none at all" where `optional`, and
    for zero rows anywhere; then there must be no values."""
    offsets = view(field, data, I64)
    if n_rows is None:
        n_rows = max(len(offsets) - 1, 0)
    if not len(offsets) and (optional or n_rows == 0):
        if n_values:
            raise InvalidInput(field, f"is empty, so {values} must be too, got {n_values} values")
        return offsets
    check_offsets(field, offsets, n_rows, n_values, values, rows)
    return offsets


def strings(field: str, msg: batch_pb2.Strings, n: int | None, rows: str) -> Strings:
    """A string column of `n` values (None: as many as its offsets say), UTF-8 throughout
    and cut between characters, so every value decodes wherever it is read."""
    utf8 = msg.utf8
    offsets = csr(f"{field}.offsets", msg.offsets, n, len(utf8), f"{field}.utf8", rows)
    if utf8 and not utf8.isascii():  # ASCII (nearly every column) is UTF-8 cut anywhere
        try:
            utf8.decode()  # one C pass over the column, not one per value
        except UnicodeDecodeError as exc:
            raise MalformedMessage(
                f"{field}.utf8", f"must be UTF-8, got byte {utf8[exc.start]:#04x} at {exc.start}"
            ) from exc
        starts = offsets[:-1]
        lead = np.frombuffer(utf8, np.uint8)[starts[starts < len(utf8)]]
        if len(lead) and ((lead & 0xC0) == 0x80).any():
            bad = int(np.flatnonzero((lead & 0xC0) == 0x80)[0])
            raise MalformedMessage(
                f"{field}.offsets[{bad}]", "must fall between characters, got one inside one"
            )
    return Strings(utf8, offsets)


def no_stray(
    field: str, per_row: NDArray[np.int64], owner_sent: NDArray[np.bool_], what: str
) -> None:
    """Rows whose owner does not send `what` (its flag 0) own none: else the batch holds
    values no request reads, and the counts that locate the others disagree."""
    stray = (per_row > 0) & ~owner_sent
    if stray.any():
        raise InvalidInput(
            f"{field}[{int(np.flatnonzero(stray)[0])}]",
            f"gives {what} to a row whose flag says it sends none",
        )


def every(sent: NDArray[np.bool_], n: int) -> NDArray[np.bool_]:
    """An optional flag column at full length (empty = all 0)."""
    return sent if len(sent) else np.zeros(n, np.bool_)
