"""The deployment files: Dockerfile and docker/compose.yaml.

No Docker daemon runs here, so nothing is built or started (README says so).
What can be checked is checked: the compose file is valid for the Compose
implementation installed (`docker-compose config`, Debian package
`docker-compose`, installed by `make test` as root) and wired consistently
with the committed Prometheus and Grafana configuration; the Dockerfile parses,
is multi-stage, runs as a non-root user with a health check, and the source it
copies is enough for the service to find its migrations and load its policies
(reproduced here by laying those paths out in a temporary directory, as the
image does under /app).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "compose.yaml"
COMPOSE_CLI = shutil.which("docker-compose")
REPLICAS = ("understudy-1", "understudy-2")
ENV = {
    "POSTGRES_PASSWORD": "pw",
    "GRAFANA_ADMIN_PASSWORD": "gpw",
    "UNDERSTUDY_AUTH_TOKENS": '{"' + "a" * 64 + '": "runtime"}',
}


def _compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert COMPOSE_CLI is not None
    return subprocess.run(
        [COMPOSE_CLI, "-p", "understudy", "-f", str(COMPOSE), "config"],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(
    COMPOSE_CLI is None, reason="docker-compose missing: install the Debian package"
)
def test_compose_file_is_valid_and_refuses_missing_secrets() -> None:
    ok = _compose_config(ENV)
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert set(resolved["services"]) >= {*REPLICAS, "postgres", "prometheus", "grafana"}
    for name, value in ENV.items():
        missing = _compose_config({k: v for k, v in ENV.items() if k != name})
        assert missing.returncode != 0, f"{name} unset was accepted"
        assert name in missing.stderr, missing.stderr
        assert value not in missing.stderr


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def test_replicas_are_what_prometheus_scrapes_and_start_after_migrations() -> None:
    services = _compose()["services"]
    scrape = yaml.safe_load((REPO / "docker/prometheus/prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    ports = {f"{name}:8080" for name in REPLICAS}
    assert targets == ports
    for name in REPLICAS:
        replica = services[name]
        assert replica["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "/readyz" in " ".join(replica["healthcheck"]["test"])
        env = replica["environment"]
        assert env["UNDERSTUDY_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["UNDERSTUDY_DATABASE_URL"]
        (volume,) = replica["volumes"]
        assert volume.endswith(":/var/lib/understudy")  # the journal survives a restart
    journals = {services[name]["volumes"][0].split(":")[0] for name in REPLICAS}
    assert len(journals) == len(REPLICAS), "replicas must not share a journal"
    assert services["migrate"]["command"] == ["db", "upgrade"]


def test_every_bind_mount_exists_and_grafana_reads_the_generated_dashboards() -> None:
    services = _compose()["services"]
    compose_dir = COMPOSE.parent
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                continue  # a named volume
            path = (compose_dir / source).resolve()
            if path.parent.name == "secrets":
                assert (path.parent / ".gitignore").is_file(), "secrets dir must stay untracked"
                continue
            assert path.exists(), f"{name}: {source} does not exist"
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    provider = yaml.safe_load(
        (REPO / "docker/grafana/provisioning/dashboards/understudy.yml").read_text()
    )
    (entry,) = provider["providers"]
    assert mounts["./grafana/dashboards"] == entry["options"]["path"]
    datasource = yaml.safe_load(
        (REPO / "docker/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert "prometheus" in services


def _dockerfile() -> DockerfileParser:
    parser = DockerfileParser(path=str(REPO / "Dockerfile"))
    return parser


def test_dockerfile_is_multi_stage_non_root_with_a_health_check() -> None:
    instructions = [(i["instruction"], i["value"]) for i in _dockerfile().structure]
    froms = [v for k, v in instructions if k == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    final = max(i for i, (k, _) in enumerate(instructions) if k == "FROM")
    tail = instructions[final:]
    users = [v for k, v in tail if k == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert any(k == "HEALTHCHECK" and "/healthz" in v for k, v in tail)
    assert not any(k == "COPY" and "--from" not in v for k, v in tail), (
        "the final stage copies only from the build stage"
    )


def test_the_source_the_image_copies_finds_its_migrations_and_loads_its_policies(
    tmp_path: Path,
) -> None:
    copied: list[str] = []
    for item in _dockerfile().structure:
        if item["instruction"] == "COPY" and "--from" not in item["value"]:
            *sources, _ = item["value"].split()
            copied += sources
    app = tmp_path / "app"
    for source in copied:
        src = REPO / source.rstrip("/")
        if src.is_dir():
            shutil.copytree(src, app / src.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            app.mkdir(exist_ok=True)
            shutil.copy2(src, app / src.name)
    probe = (
        "import sys\n"
        "from service.storage.migrate import MIGRATIONS_DIR\n"
        "from service.policies.registry import load_registry\n"
        "assert (MIGRATIONS_DIR / 'env.py').is_file(), MIGRATIONS_DIR\n"
        "registry = load_registry(__import__('pathlib').Path('policies'))\n"
        "print(len(registry.policies), MIGRATIONS_DIR)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=app,
        env={**os.environ, "PYTHONPATH": str(app)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    n_policies, migrations = done.stdout.split()
    assert int(n_policies) >= 5
    assert Path(migrations) == app / "migrations"
