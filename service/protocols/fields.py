"""Typed readers for protocol documents: each raises `InvalidInput` naming the field.

Shared by the protocol parser; kept apart so the parser reads as the schema.
`bool` is refused wherever a number is expected (YAML's ``yes`` is not 1).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from service.contract.errors import InvalidInput

ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
PRINCIPAL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
DURATION_PATTERN = r"^([0-9]+(?:\.[0-9]+)?)\s*([smhd])$"
MAX_DURATION_S = 366 * 86400.0
"""A year: longer is a typo, not an experiment."""

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
E = TypeVar("E", bound=StrEnum)


def kind_of(value: object) -> str:
    """The YAML-ish type name of `value`, for messages."""
    return "null" if value is None else type(value).__name__


def mapping(value: object, path: str) -> Mapping[str, Any]:
    """`value` as a mapping."""
    if not isinstance(value, Mapping):
        raise InvalidInput(path, f"must be a mapping, got {kind_of(value)}")
    return value


def check_keys(
    data: Mapping[str, Any], path: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    """Refuse unknown keys (a typo must not silently drop a setting) and missing ones."""
    prefix = f"{path}." if path else ""
    for key in data:
        if key not in required and key not in optional:
            allowed = ", ".join(sorted(required + optional))
            raise InvalidInput(f"{prefix}{key}", f"is not a known key here (allowed: {allowed})")
    for key in required:
        if key not in data:
            raise InvalidInput(f"{prefix}{key}", "is required")


def string(value: object, path: str, pattern: str | None = None) -> str:
    """`value` as a string, optionally matching `pattern`."""
    if not isinstance(value, str):
        raise InvalidInput(path, f"must be a string, got {kind_of(value)} {value!r}")
    if pattern is not None and not re.match(pattern, value):
        raise InvalidInput(path, f"must match {pattern}, got {value!r}")
    return value


def number(
    value: object,
    path: str,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    why: str = "",
) -> float:
    """A finite number within bounds; `why` explains the bound in the message."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(path, f"must be a number, got {kind_of(value)} {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise InvalidInput(path, f"must be finite, got {x}")
    bad_low = low is not None and (x <= low if open_low else x < low)
    bad_high = high is not None and (x >= high if open_high else x > high)
    if bad_low or bad_high:
        if low is not None and high is not None:
            lo, hi = "(" if open_low else "[", ")" if open_high else "]"
            expect = f"in {lo}{low:g}, {high:g}{hi}"
        elif low is not None:
            expect = f"{'>' if open_low else '>='} {low:g}"
        else:
            expect = f"{'<' if open_high else '<='} {high:g}"
        raise InvalidInput(path, f"must be {expect}{why}, got {value!r}")
    return x


def text(value: object, path: str) -> str:
    """A string with something in it."""
    text = string(value, path)
    if not text.strip():
        raise InvalidInput(path, "must say something, got an empty string")
    return text


def integer(value: object, path: str, low: int) -> int:
    """An integer (not a bool) >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(path, f"must be an integer, got {kind_of(value)} {value!r}")
    if value < low:
        raise InvalidInput(path, f"must be >= {low}, got {value}")
    return value


def enum_value(cls: type[E], value: object, path: str) -> E:
    """A member of enum `cls` by value."""
    allowed = [m.value for m in cls]
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput(path, f"must be one of {', '.join(allowed)}, got {value!r}")
    return cls(value)


def items(value: object, path: str, *, non_empty: bool = False) -> list[Any]:
    """`value` as a list."""
    if not isinstance(value, list):
        raise InvalidInput(path, f"must be a list, got {kind_of(value)}")
    if non_empty and not value:
        raise InvalidInput(path, "must list at least one entry")
    return value


def names(
    value: object, path: str, pattern: str, allowed: type[E] | None = None
) -> tuple[str, ...]:
    """A non-empty list of unique names, sorted: order carries no meaning, so no hash change."""
    seen: list[str] = []
    for i, v in enumerate(items(value, path, non_empty=True)):
        name = string(v, f"{path}[{i}]", pattern)
        if allowed is not None:
            enum_value(allowed, name, f"{path}[{i}]")
        if name in seen:
            raise InvalidInput(f"{path}[{i}]", f"repeats {name!r}")
        seen.append(name)
    return tuple(sorted(seen))


def parse_duration(value: object, path: str) -> float:
    """Seconds from a number of seconds or ``"<n>s|m|h|d"``, e.g. ``"14d"``."""
    if isinstance(value, str):
        match = re.match(DURATION_PATTERN, value.strip())
        if match is None:
            raise InvalidInput(path, f"must be seconds or like '12h' / '14d', got {value!r}")
        seconds = float(match.group(1)) * UNITS[match.group(2)]
    else:
        seconds = number(value, path)
    if seconds <= 0:
        raise InvalidInput(path, f"must be > 0, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise InvalidInput(path, f"must be <= {MAX_DURATION_S / 86400:g}d, got {value!r}")
    return seconds
