"""Extra sections of the OPE evidence package (calibration, drift, failure modes, ...).

Each section is built by its own module from the decision log and handed to
the package as a `ReportSection`; the package lays every section out the same
way (a heading, its Markdown/HTML body, its figures under ``figures/``, its
numbers under ``results.json["sections"][key]``). Keeping the interface this
small lets each analysis live in its own module without the package knowing
its internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, eq=False)
class ReportSection:
    """One section of the package.

    `markdown` and `html` are the section body only (no heading); figures are
    referenced from both as ``figures/<name>`` and their PNG bytes are in
    `figures`. `html` must already be escaped. `results` goes into
    ``results.json`` under ``sections[key]`` and must be JSON-serialisable.
    `limitations` are findings for the "known limitations and assumptions"
    section, one sentence each.
    """

    key: str
    title: str
    markdown: str
    html: str
    figures: Mapping[str, bytes] = field(default_factory=dict)
    results: Mapping[str, Any] = field(default_factory=dict)
    limitations: tuple[str, ...] = ()
