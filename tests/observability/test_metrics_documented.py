"""Every metric the service can export has a row in docs/metrics.md.

On-call reads docs/metrics.md to learn what a series means; a metric added in
code without its row is a series nobody can interpret at 3 a.m. The names are
read from the source (the first argument of every prometheus_client
constructor), so a metric registered outside `ServiceMetrics` counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


def _constructed_metric_names() -> dict[str, str]:
    """Metric name -> the file that constructs it."""
    names: dict[str, str] = {}
    for path in sorted((ROOT / "service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            name = getattr(node.args[0], "value", None)
            if called in METRIC_TYPES and isinstance(name, str) and name.startswith("understudy_"):
                names[name] = str(path.relative_to(ROOT))
    return names


def test_the_scan_finds_the_service_metrics() -> None:
    names = _constructed_metric_names()
    # the precondition of the next test: the scan sees the service's and the evaluator's
    # (the evaluator families are defined only in `ServiceMetrics` since issue 21)
    assert {"understudy_ingest", "understudy_db_up", "understudy_grpc_streams_open"} <= set(names)
    assert names["understudy_evaluator_ticks"] == "service/metrics.py"
    assert len(names) >= 50


def test_every_metric_has_a_row_in_docs_metrics() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    missing = {
        name: where
        for name, where in _constructed_metric_names().items()
        if f"`{name}`" not in doc
        and f"`{name}_total`" not in doc
        and f"`{name}_seconds`" not in doc
        and not any(f"`{name}_{suffix}`" in doc for suffix in ("bucket", "count", "sum"))
    }
    assert not missing, f"metrics without a row in docs/metrics.md: {missing}"
