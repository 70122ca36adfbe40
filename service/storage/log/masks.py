"""Reading ``requests.feasibility_bits``: which signals masked which option, by version.

A row's bits are read with the signal list of the feasibility version logged
beside them (``requests.feasibility_version``), never with today's `SIGNALS`:
bit i of a ``feasibility-v1`` row is v1's signal i even after the function
gained signals. `SIGNALS_BY_VERSION` keeps every version's list, in bit order;
a test holds the current version's entry to `SIGNALS`. A row logged before
migration 0010 has no bits (NULL): it reads as "not logged", and replay still
recomputes its feasibility from the stored request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

BITS_DTYPE = np.dtype("<u2")
"""Layout of ``requests.feasibility_bits`` (what `service.pipeline.feasibility_log` packs)."""

SIGNALS_BY_VERSION: dict[str, tuple[str, ...]] = {
    "feasibility-v1": (
        "capacity",
        "accelerator_memory",
        "hardware_compatibility",
        "affinity",
        "anti_affinity",
        "quota",
        "drain",
    ),
    "feasibility-v2": (
        "accelerator_count",
        "accelerator_share",
        "accelerator_memory",
        "cpu",
        "memory",
        "hardware_compatibility",
        "affinity",
        "anti_affinity",
        "quota",
        "drain",
    ),
}
"""Signal names of each feasibility version, in bit order (bit i = name i)."""

NOT_LOGGED = "not logged"
"""What a surface says for a row without bits (logged before migration 0010)."""


@dataclass(frozen=True, eq=False)
class LoggedMask:
    """One request's logged per-option feasibility.

    Attributes:
        version: ``requests.feasibility_version`` (None when not logged).
        bits: one int per option (bit i = ``names[i]`` fired); None when not logged.
        names: the version's signal names; None for a version this code does not know.
    """

    version: str | None
    bits: NDArray[np.uint16] | None
    names: tuple[str, ...] | None

    @property
    def logged(self) -> bool:
        """Whether the row carries bits at all."""
        return self.bits is not None

    @property
    def readable(self) -> bool:
        """Whether the bits can be named (logged, with a known version)."""
        return self.bits is not None and self.names is not None

    @property
    def status(self) -> str:
        """``logged``, ``not logged`` or ``unknown version <v>``: what a surface shows."""
        if self.bits is None:
            return NOT_LOGGED
        return "logged" if self.names is not None else f"unknown version {self.version}"

    def feasible(self, option: int) -> bool | None:
        """Whether `option` passed every signal; None when not logged."""
        return None if self.bits is None else int(self.bits[option]) == 0

    def signals(self, option: int) -> tuple[str, ...] | None:
        """The names of the signals that masked `option`; None when not readable."""
        if self.bits is None or self.names is None:
            return None
        value = int(self.bits[option])
        return tuple(n for i, n in enumerate(self.names) if value >> i & 1)


def unpack_bits(blob: bytes) -> NDArray[np.uint16]:
    """Decode ``requests.feasibility_bits``: one uint16 per option."""
    if len(blob) % BITS_DTYPE.itemsize:
        raise ValueError(f"feasibility_bits of {len(blob)} bytes is not a whole number of uint16")
    return np.frombuffer(blob, dtype=BITS_DTYPE).astype(np.uint16)


def logged_mask(version: str | None, blob: bytes | None) -> LoggedMask:
    """A row's mask from its two columns (NULL bits: not logged)."""
    if blob is None:
        return LoggedMask(None, None, None)
    names = SIGNALS_BY_VERSION.get(version or "")
    return LoggedMask(version, unpack_bits(bytes(blob)), names)


def mask_of(version: str, bits: NDArray[np.integer]) -> LoggedMask:
    """A mask from bits just computed (e.g. `Feasibility.bits`), read like a logged one."""
    return LoggedMask(version, np.asarray(bits, dtype=np.uint16), SIGNALS_BY_VERSION.get(version))
