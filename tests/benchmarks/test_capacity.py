"""The capacity model: fit, held-out check, plan arithmetic, refusals, and the CLI.

Points are generated from known coefficients (the ground truth), so the fit
must recover them and the held-out check must be exact; the CLI runs against
result files written here in the benchmark's format.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.capacity import Coefficients, CostModel, CostPoint, check, fit, plan, replica_rate
from service.cli.main import app

SERVER = Coefficients(a=300e-6, e=40e-6, f=2e-6)
POSTGRES = Coefficients(a=20e-6, e=8e-6, f=0.1e-6)
SHAPES = [(50, 6), (20, 6), (50, 2), (35, 4)]


def _point(options: int, policies: int) -> CostPoint:
    return CostPoint(
        options, policies, SERVER.cost(options, policies), POSTGRES.cost(options, policies)
    )


def test_fit_recovers_the_generating_coefficients() -> None:
    model = fit([_point(*s) for s in SHAPES[:3]])
    for got, want in ((model.server, SERVER), (model.postgres, POSTGRES)):
        assert got.a == pytest.approx(want.a, rel=1e-9)
        assert got.e == pytest.approx(want.e, rel=1e-9)
        assert got.f == pytest.approx(want.f, rel=1e-9)


def test_held_out_point_is_predicted_and_its_error_reported() -> None:
    model = fit([_point(*s) for s in SHAPES[:3]])
    exact = check(model, _point(*SHAPES[3]))
    assert exact.server_error == pytest.approx(0.0, abs=1e-9)
    off = CostPoint(35, 4, exact.point.server_cpu_s * 2, exact.point.postgres_cpu_s)
    assert check(model, off).server_error == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([_point(50, 6), _point(20, 6)], "at least 3"),
        ([_point(50, 6), _point(50, 6), _point(50, 6)], "vary both"),
    ],
)
def test_fit_refuses_points_that_cannot_pin_the_model(
    points: list[CostPoint], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fit(points)


def test_plan_scales_cores_rows_and_replicas() -> None:
    model = CostModel(SERVER, POSTGRES, idle_cores=0.05, replica_rate=500.0)
    p = plan(model, 10_000, 50, 6)
    assert p.replicas == 20  # 10,000 / 500 per replica (GIL-bound before the CPU runs out)
    assert p.server_cores == pytest.approx(10_000 * SERVER.cost(50, 6) + 20 * 0.05)
    assert p.postgres_cores == pytest.approx(10_000 * POSTGRES.cost(50, 6))
    assert p.db_rows_per_s == 10_000 * 8
    assert p.decision_rows_per_s == 60_000
    # a measured ceiling above what one core can do: the CPU bound decides (1.14 ms/request)
    optimistic = CostModel(SERVER, POSTGRES, replica_rate=4000.0)
    assert plan(optimistic, 10_000, 50, 6).replicas == 12
    # fewer options per request: each replica goes further, in proportion to the cost
    assert replica_rate(model, 20, 6) == pytest.approx(
        500.0 * SERVER.cost(50, 6) / SERVER.cost(20, 6)
    )


@pytest.mark.parametrize(
    ("rate", "options", "policies", "field"),
    [(-1.0, 50, 6, "rate"), (100.0, 0, 6, "options"), (100.0, 50, -1, "policies")],
)
def test_plan_refuses_bad_input_naming_the_field(
    rate: float, options: int, policies: int, field: str
) -> None:
    with pytest.raises(ValueError, match=f"`{field}`"):
        plan(CostModel(SERVER, POSTGRES), rate, options, policies)


def _write_results(directory: Path, shapes: list[tuple[int, int]]) -> None:
    points = [
        {
            "options": k,
            "policies": p,
            "server_cpu_s_per_request": SERVER.cost(k, p),
            "postgres_cpu_s_per_request": POSTGRES.cost(k, p),
            "idle_server_cores": 0.02,
        }
        for k, p in shapes
    ]
    doc = {"benchmark": "capacity", "quick": False, "details": {"points": points}}
    (directory / "capacity.json").write_text(json.dumps(doc))
    e2e = {"details": {"transports": [{"transport": "stream", "sustained": 5000.0}]}}
    (directory / "e2e.json").write_text(json.dumps(e2e))


def test_cli_prints_check_and_plan(tmp_path: Path) -> None:
    _write_results(tmp_path, SHAPES)
    result = CliRunner().invoke(
        app, ["capacity", "--rate", "20000", "--results", str(tmp_path)], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "held-out point K=35, P=4" in text
    assert re.search(r"predicted 740 us vs measured 740 us \([+-]0%\)", text), text
    assert "160,000" in text  # 20,000 x (2 + 6) rows/s


@pytest.mark.parametrize(
    ("args", "shapes", "message"),
    [
        (["--rate", "100"], None, "cannot read"),
        (["--rate", "100"], SHAPES[:2], "holds 2 points"),
        (["--rate", "-5"], SHAPES, "`--rate` must be >= 0"),
        (["--rate", "100", "--options", "0"], SHAPES, "`--options` must be >= 1"),
    ],
)
def test_cli_refuses_with_exit_2(
    tmp_path: Path, args: list[str], shapes: list[tuple[int, int]] | None, message: str
) -> None:
    if shapes is not None:
        _write_results(tmp_path, shapes)
    result = CliRunner().invoke(
        app, ["capacity", *args, "--results", str(tmp_path)], terminal_width=200
    )
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
