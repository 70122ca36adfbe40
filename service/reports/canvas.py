"""The one way every evidence package draws: an Agg figure and its PNG bytes.

matplotlib's Agg canvas is attached to each figure (no pyplot, no global
backend), so importing a report changes no process-wide state and draws
without a display, on any thread.
"""

from __future__ import annotations

import io
import re

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def figure(width: float, height: float) -> Figure:
    """A figure of `width` x `height` inches with constrained layout, on an Agg canvas."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (90 dpi: readable in HTML, small in a package)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def file_name(label: str) -> str:
    """A safe PNG file name for `label`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label) + ".png"
