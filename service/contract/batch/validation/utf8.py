"""Per-string facts of a `Strings` column, computed on its UTF-8 bytes.

Text rules work on the UTF-8 buffers as uint8: a C0 control character is a
byte < 0x20 (UTF-8 never uses those bytes inside a multi-byte character), and
a string's length in characters (what ``len(str)`` counts, the limits' unit)
is its count of bytes that are not continuation bytes (``0b10xxxxxx``). So a
whole column is checked without building one Python `str` per value; a string
is decoded only to quote it back in a refusal.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import Strings
from service.contract.batch.validation.arrays import I64, Mask, _counts_in
from service.contract.text import RULE as TEXT_RULE

_SHOWN = 40  # characters of an offending string quoted back (service.contract.text)


class _Text:
    """Per-string facts of a `Strings` column, from its UTF-8 bytes (module docstring)."""

    def __init__(self, s: Strings) -> None:
        self.s = s
        o = np.asarray(s.offsets, dtype=np.int64) if len(s.offsets) else np.zeros(1, np.int64)
        self.offsets = o
        self.n = len(o) - 1
        self.raw = np.frombuffer(s.utf8, dtype=np.uint8)
        self.nbytes = o[1:] - o[:-1]

    @property
    def empty(self) -> Mask:
        empty: Mask = self.nbytes == 0
        return empty

    def control(self) -> Mask:
        """Strings holding a C0 control character."""
        low = self.raw < 0x20
        if not low.any():
            return np.zeros(self.n, np.bool_)
        return _counts_in(low, self.offsets) > 0

    def chars(self) -> I64:
        """Length in characters (code points) of each string."""
        if self.raw.size == 0 or not (self.raw >= 0x80).any():  # ASCII: bytes are characters
            return self.nbytes
        return _counts_in((self.raw & 0xC0) != 0x80, self.offsets)

    def value(self, i: int) -> str:
        return self.s[i]

    def hashes(self) -> NDArray[np.uint64]:
        """A 64-bit polynomial hash per string (equal strings hash alike; collisions are
        verified by whoever relies on equality)."""
        nb = self.nbytes
        if self.raw.size == 0:
            return np.zeros(self.n, np.uint64)
        top = int(nb.max())
        powers = np.full(top, 0x100000001B3, dtype=np.uint64)
        powers[0] = 1
        powers = np.cumprod(powers, dtype=np.uint64)
        start = np.repeat(self.offsets[:-1], nb)
        pos = np.arange(self.raw.size, dtype=np.int64) - start
        weighted = (self.raw.astype(np.uint64) + np.uint64(1)) * powers[pos]
        total = np.zeros(self.raw.size + 1, dtype=np.uint64)
        np.cumsum(weighted, out=total[1:])
        out: NDArray[np.uint64] = total[self.offsets[1:]] - total[self.offsets[:-1]]
        return out

    def short_codes(self, width: int = 8) -> tuple[Mask, NDArray[np.uint64]]:
        """Strings of at most `width` (<= 8) bytes as one exact uint64 code each."""
        fits = self.nbytes <= width
        codes = np.zeros((self.n, 8), dtype=np.uint8)
        rows = np.flatnonzero(fits)
        if len(rows) and self.raw.size:
            lengths = self.nbytes[rows]
            row = np.repeat(rows, lengths)
            start = np.repeat(self.offsets[rows], lengths)
            pos = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
                np.cumsum(lengths) - lengths, lengths
            )
            codes[row, pos] = self.raw[start + pos]
        return fits, codes.view(np.uint64).reshape(-1)


def _code_of(text: str) -> int:
    raw = text.encode().ljust(8, b"\0")
    return int(np.frombuffer(raw, dtype=np.uint64)[0])


def _text_refusal(value: str, where: str = "") -> str:
    return f"{where}{TEXT_RULE}, got {value[:_SHOWN]!r}"


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 for c in text)
