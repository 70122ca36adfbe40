"""Placement options Runtime enumerates, and the action space over them.

An option is one node or a group of nodes (for a gang job) with the number of
accelerators taken on each. Options are stored in compressed sparse row form:
option ``i`` covers entries ``node_offsets[i]:node_offsets[i + 1]`` of
``node_index`` and ``accelerators``. The action is an option index in
``[0, n_options)`` or `DEFER` (place nothing now).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.errors import InvalidInput
from service.contract.state import EMPTY_I32, EMPTY_I64, frozen_array

DEFER: int = -1
"""The action that places nothing now; Runtime may retry later."""


@dataclass(frozen=True, eq=False)
class PlacementOptions:
    """Candidate placements for one request, as CSR arrays.

    Attributes:
        node_offsets: int64, shape ``(n_options + 1,)``, non-decreasing, starts at 0.
        node_index: int32, shape ``(n_entries,)``, node index into the cluster state.
        accelerators: int32, shape ``(n_entries,)``, accelerators taken on that node.
        option_ids: Runtime's id per option (may be empty strings).
        device_offsets: int64, shape ``(n_entries + 1,)``, or empty: the devices each
            node entry would use, in CSR form over ``device_index``; empty = options
            do not name devices, and feasibility asks whether *some* devices of the
            node fit (docs/contract.md, "Feasibility").
        device_index: int32, index into the state's device columns (global, not per
            node); each named device must belong to its entry's node.
    """

    node_offsets: NDArray[np.int64]
    node_index: NDArray[np.int32]
    accelerators: NDArray[np.int32]
    option_ids: tuple[str, ...]
    device_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    device_index: NDArray[np.int32] = field(default_factory=lambda: EMPTY_I32)

    @property
    def names_devices(self) -> bool:
        """Whether the options name the devices each entry would use."""
        return len(self.device_offsets) > 0

    @property
    def n_options(self) -> int:
        """Number of options (the defer action is not an option)."""
        return len(self.node_offsets) - 1

    @cached_property
    def nodes_per_option(self) -> NDArray[np.int64]:
        """Number of nodes in each option, shape ``(n_options,)``; read-only.

        Cached: features, feasibility and every predictor's features ask for it
        on each request, and the options never change.
        """
        sizes = np.diff(self.node_offsets)
        sizes.flags.writeable = False
        return sizes

    @cached_property
    def entry_option(self) -> NDArray[np.int64]:
        """Option index of every CSR entry, shape ``(n_entries,)``; read-only, cached."""
        index = np.repeat(np.arange(self.n_options), self.nodes_per_option)
        index.flags.writeable = False
        return index

    def nodes_of(self, option: int) -> NDArray[np.int32]:
        """Node indices of option `option`."""
        start, end = self.node_offsets[option], self.node_offsets[option + 1]
        return self.node_index[start:end]


def single_node_options(node_index: NDArray[np.int32], accelerators: int) -> PlacementOptions:
    """Options that each place the whole job on one node: the common case."""
    nodes = np.asarray(node_index, dtype=np.int32)
    return PlacementOptions(
        node_offsets=np.arange(len(nodes) + 1, dtype=np.int64),
        node_index=nodes,
        accelerators=np.full(len(nodes), accelerators, dtype=np.int32),
        option_ids=tuple("" for _ in range(len(nodes))),
    )


def options_from_columns(src: Any) -> PlacementOptions:
    """`PlacementOptions` from either wire form (protobuf or HTTP JSON: same field names).

    CSR consistency is checked by the validator; an empty option list is refused here
    because `n_options` needs at least the leading offset.
    """
    offsets = frozen_array(src.node_offsets, np.int64)
    if len(offsets) == 0:
        raise InvalidInput("options", "must list at least one placement option")
    return PlacementOptions(
        node_offsets=offsets,
        node_index=frozen_array(src.node_index, np.int32),
        accelerators=frozen_array(src.accelerators, np.int32),
        option_ids=tuple(src.option_ids),
        **_named_devices(src),
    )


def _named_devices(src: Any) -> dict[str, Any]:
    """The options' named devices as keyword arguments; none (the defaults) when not named."""
    if not len(src.device_offsets):
        if len(src.device_index):
            raise InvalidInput("options.device_offsets", "must be set when device_index is given")
        return {}
    return {
        "device_offsets": frozen_array(src.device_offsets, np.int64),
        "device_index": frozen_array(src.device_index, np.int32),
    }
