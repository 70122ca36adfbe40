"""The one check of a CSR offsets column: shape, start, order and end.

The contract carries several ragged lists in compressed sparse row form (node
devices over nodes, named devices over option entries): row i owns
``values[offsets[i]:offsets[i + 1]]``. The decoder needs the layout sound
before it can derive anything from it (node accelerator counts from devices),
and the validator checks it for every request that sends it; both call this so
a refusal names the same field with the same message whichever finds it first.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract.errors import InvalidInput


def check_offsets(
    field: str, offsets: NDArray[np.int64], n_rows: int, n_values: int, values: str, rows: str
) -> None:
    """Raise `InvalidInput` naming `field` unless `offsets` is a CSR index of n_rows rows.

    Args:
        field: the offsets column's path, e.g. ``"state.device_offsets"``.
        offsets: the column as sent.
        n_rows: rows it must cover (nodes, option entries); it has ``n_rows + 1`` entries.
        n_values: length of the columns it indexes; the last offset must equal it.
        values: how to name those columns in the message.
        rows: how to name the row count in the message (``"n_nodes"``).
    """
    if len(offsets) != n_rows + 1:
        raise InvalidInput(
            field, f"must have {rows} + 1 ({n_rows + 1}) entries, got {len(offsets)}"
        )
    if offsets[0] != 0:
        raise InvalidInput(f"{field}[0]", f"must be 0, got {offsets[0]}")
    steps = offsets[1:] - offsets[:-1]
    if len(steps) and np.minimum.reduce(steps) < 0:
        bad = int(np.flatnonzero(steps < 0)[0]) + 1
        raise InvalidInput(f"{field}[{bad}]", f"must be non-decreasing, got {offsets[bad]}")
    if offsets[-1] != n_values:
        raise InvalidInput(
            f"{field}[{n_rows}]",
            f"must end at len({values}) ({n_values}), got {offsets[-1]}",
        )
