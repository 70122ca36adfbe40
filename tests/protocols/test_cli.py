"""``understudy protocol ...`` against the real HTTP server, and offline validation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from service.cli.protocols import protocol_app
from service.protocols import content_hash, parse_protocol
from tests.protocols.conftest import PROTOCOLS_DIR, REPO, SHADOW_FILE, unique

runner = CliRunner()


def run(*args: str, token: str | None = None, url: str = "") -> tuple[int, str]:
    env = {"UNDERSTUDY_URL": url, "UNDERSTUDY_TOKEN": token or ""}
    result = runner.invoke(protocol_app, list(args), env=env)
    return result.exit_code, " ".join(result.output.split())  # undo rich's line wrapping


@pytest.mark.parametrize("path", sorted(PROTOCOLS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_validate_every_shipped_protocol_offline(path: Path) -> None:
    code, out = run("validate", str(path), "--policies-dir", str(REPO / "policies"))
    assert code == 0, out
    assert f"content sha256 {content_hash(parse_protocol(yaml.safe_load(path.read_text())))}" in out


def test_validate_names_the_field_and_fails(tmp_path: Path) -> None:
    doc = yaml.safe_load(SHADOW_FILE.read_text())
    doc["guardrails"][0]["margin"] = -1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    code, out = run("validate", str(bad), "--policies-dir", str(REPO / "policies"))
    assert code == 1
    assert "error `guardrails[0].margin`" in out and "invalid" in out


def test_the_whole_online_path_through_the_cli(
    server_url: str, online_doc: dict[str, Any], tmp_path: Path
) -> None:
    doc = unique(online_doc)
    file = tmp_path / "online.yaml"
    file.write_text(yaml.safe_dump(doc))
    ref = f"{doc['id']}@1"
    code, out = run("submit", str(file), token="alice-admin", url=server_url)
    assert code == 0 and ": draft (online-bounded)" in out, out
    sha = re.search(r"sha256 ([0-9a-f]{64})", out)
    assert sha is not None
    code, out = run("start", str(file), "--reason", "go", token="alice-admin", url=server_url)
    assert code == 1 and "refused (409)" in out and "only after approval" in out
    args = ("approve", ref, "--sha256", sha.group(1), "--reason", "bounds ok")
    code, out = run(*args, token="root-admin", url=server_url)
    assert code == 1 and "refused (403)" in out and "`admin` cannot approve" in out
    code, out = run(*args, token="dave-safety", url=server_url)
    assert code == 0 and ": approved" in out, out
    code, out = run("start", str(file), "--reason", "go", token="alice-admin", url=server_url)
    assert code == 0 and ": running" in out, out
    code, out = run("stop", ref, "--reason", "enough", token="dave-safety", url=server_url)
    assert code == 0 and ": stopped" in out, out
    code, out = run("status", ref, token="rita-reviewer", url=server_url)
    assert code == 0, out
    for expected in ("submit", "approve", "dave (safety)", "bounds ok", "start", "stop"):
        assert expected in out
    code, out = run("status", token="rita-reviewer", url=server_url)
    assert code == 0 and f"{doc['id']}@1: stopped" in out


def test_bad_refs_and_unreachable_services(tmp_path: Path) -> None:
    code, out = run("stop", "no-version", "--reason", "x", token="t", url="http://127.0.0.1:9")
    assert code == 2 and "ID@VERSION" in out
    code, out = run("stop", "p@1", "--reason", "x", token="t", url="http://127.0.0.1:9")
    assert code == 3 and "cannot reach" in out


def test_schema_check_passes_on_the_committed_file_and_fails_on_a_stale_one(
    tmp_path: Path,
) -> None:
    code, out = run("schema", str(PROTOCOLS_DIR / "schema.json"), "--check")
    assert code == 0, out
    stale = tmp_path / "schema.json"
    stale.write_text("{}\n")
    code, out = run("schema", str(stale), "--check")
    assert code == 1 and "stale" in out
    code, _ = run("schema", str(stale))
    assert code == 0 and stale.read_text() == (PROTOCOLS_DIR / "schema.json").read_text()
