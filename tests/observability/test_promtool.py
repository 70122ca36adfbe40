"""promtool: the scrape config, the rules, and a unit test case for every alert."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.observability.dashboards import PROMETHEUS_DIR, alert_exprs

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: install the Debian package `prometheus`"
)


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_config_is_valid(tmp_path: Path) -> None:
    # The config names a token file that exists only in the container: point it at one here.
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    token = tmp_path / "token"
    token.write_text("r-tok\n")
    for job in config["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(token)
    config["rule_files"] = [str(PROMETHEUS_DIR / "rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert "SUCCESS" in _promtool("check", "config", "prometheus.yml", cwd=tmp_path)


def test_rules_are_valid() -> None:
    assert "SUCCESS" in _promtool("check", "rules", "rules.yml")


def test_rule_unit_tests_pass() -> None:
    files = sorted(str(p.relative_to(PROMETHEUS_DIR)) for p in PROMETHEUS_DIR.glob("tests/*.yml"))
    assert files
    assert "SUCCESS" in _promtool("test", "rules", *files)


def test_every_alert_has_a_unit_test_case() -> None:
    tested = {
        case["alertname"]
        for path in PROMETHEUS_DIR.glob("tests/*.yml")
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    missing = set(alert_exprs()) - tested
    assert not missing, f"alerts without a firing test case: {sorted(missing)}"
