"""A newcomer's mistakes answer in two lines: what is missing, where it looked, what fixes it.

Every command that reads the decision log runs against each way the log can
be absent — no data directory, a data directory whose embedded database was
never migrated, an empty database behind a URL, a URL that does not answer, a
URL that does not parse — and every command gets a bad argument. Each must
exit non-zero, print no traceback, name the place it looked, and stay short.
Real embedded PostgreSQL (tests/pg_fixtures.py); nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from service.cli.errors import UserError
from service.cli.main import app
from service.storage import running_pid, start_embedded, stop_embedded
from service.storage.admin import EMBEDDED_SUBDIR
from tests.pg_fixtures import pg_home

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/x"

# Every command that reads the decision log, with arguments that are otherwise fine.
LOG_COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "ope": lambda tmp: ["ope"],
    "evidence": lambda tmp: ["evidence", "--out", str(tmp / "evidence")],
    "export": lambda tmp: ["export", "--out", str(tmp / "slice")],
    "replay": lambda tmp: ["replay", "--request-id", "r-1", "--policy", "gavel-scorer"],
    "log seal": lambda tmp: ["log", "seal"],
    "log verify": lambda tmp: ["log", "verify"],
    "log retire": lambda tmp: ["log", "retire", "--before", "2020-01-01"],
}


@dataclass(frozen=True)
class Where:
    """A database condition: the environment, and what the message must name."""

    env: dict[str, str]
    names: tuple[str, ...]


@pytest.fixture(scope="module")
def empty_data_dir() -> Iterator[Path]:
    """A data directory whose embedded database exists but was never migrated (stopped)."""
    with pg_home() as home:
        root = home / "empty"
        root.mkdir()
        start_embedded(root / EMBEDDED_SUBDIR)
        stop_embedded(root / EMBEDDED_SUBDIR)
        try:
            yield root
        finally:
            stop_embedded(root / EMBEDDED_SUBDIR)


@pytest.fixture()
def where(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    empty_data_dir: Path,
    fresh_db: Callable[[bool], str],
    monkeypatch: pytest.MonkeyPatch,
) -> Where:
    """The condition named by the test's parameter.

    The fix a missing log gets depends on whether the demo's log (``out/demo``, relative
    to where the command runs) exists, so both cases run in a directory of the test's own
    rather than in the checkout, where a developer's `make demo` may have left one."""
    kind = request.param
    if kind in ("no database", "no database, demo log present"):
        missing = tmp_path / "no-such-data-dir"
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        if kind == "no database":
            return Where(_env(data_dir=missing), (str(missing), "no decision log", "make demo"))
        (cwd / "out" / "demo" / "postgres").mkdir(parents=True)
        (cwd / "out" / "demo" / "postgres" / "PG_VERSION").write_text("18\n")
        return Where(
            _env(data_dir=missing),
            (str(missing), "no decision log", "the demo's log is in out/demo"),
        )
    if kind == "empty data dir":
        return Where(_env(data_dir=empty_data_dir), (str(empty_data_dir), "no decision log"))
    if kind == "empty database":
        url = fresh_db(False)
        return Where(_env(url=url), ("no decision log", "db upgrade"))
    if kind == "unreachable URL":
        return Where(_env(url=UNREACHABLE), (UNREACHABLE, "Connection refused"))
    assert kind == "ill-formed URL"
    return Where(_env(url="notaurl"), ("'notaurl'", "not a database URL"))


def _env(*, data_dir: Path | None = None, url: str = "") -> dict[str, str]:
    return {
        "UNDERSTUDY_DATA_DIR": str(data_dir or "/nonexistent-understudy"),
        "UNDERSTUDY_DATABASE_URL": url,
        "UNDERSTUDY_DEBUG": "",
        "COLUMNS": "80",
    }


def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(app, args, env=env)


def check_short(out: Result, most_lines: int = 2) -> list[str]:
    """Non-zero exit, no traceback, at most `most_lines` lines; the lines."""
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert out.exit_code not in (0, None), out.output
    assert "Traceback" not in out.output, out.output
    assert isinstance(out.exception, SystemExit), repr(out.exception)
    assert 1 <= len(lines) <= most_lines, out.output
    return lines


CONDITIONS = [
    "no database",
    "no database, demo log present",
    "empty data dir",
    "empty database",
    "unreachable URL",
    "ill-formed URL",
]


@pytest.mark.parametrize("where", CONDITIONS, indirect=True)
@pytest.mark.parametrize("command", list(LOG_COMMANDS))
def test_a_log_command_without_a_decision_log_says_where_it_looked(
    command: str, where: Where, tmp_path: Path
) -> None:
    out = invoke(LOG_COMMANDS[command](tmp_path), where.env)
    lines = check_short(out)
    assert lines[0].startswith("error: "), out.output
    for name in where.names:
        assert name in out.output, (name, out.output)
    assert len(lines) == 2 and lines[1].startswith("fix: "), out.output
    assert not (tmp_path / "evidence").exists() and not (tmp_path / "slice").exists()


@pytest.mark.parametrize("where", ["no database", "empty data dir"], indirect=True)
def test_the_fix_names_the_demo_data_dir_and_the_command(where: Where) -> None:
    lines = check_short(invoke(["log", "verify"], where.env))
    assert lines[1].startswith("fix: "), lines
    assert "UNDERSTUDY_DATA_DIR=out/demo understudy log verify" in lines[1], lines


def test_a_read_command_creates_no_data_dir(tmp_path: Path) -> None:
    missing = tmp_path / "never-made"
    check_short(invoke(["ope"], _env(data_dir=missing)))
    assert not missing.exists()


def test_an_embedded_server_started_only_to_look_is_stopped_again(empty_data_dir: Path) -> None:
    pg_dir = empty_data_dir / EMBEDDED_SUBDIR
    assert running_pid(pg_dir) is None  # precondition: the command has to start it
    check_short(invoke(["ope"], _env(data_dir=empty_data_dir)))
    assert running_pid(pg_dir) is None


@pytest.mark.parametrize("where", ["unreachable URL", "ill-formed URL"], indirect=True)
def test_db_upgrade_on_a_bad_url_says_which_url(where: Where) -> None:
    out = invoke(["db", "upgrade"], where.env)
    check_short(out)
    for name in where.names:
        assert name in out.output, (name, out.output)


def test_debug_shows_the_exception_instead(tmp_path: Path) -> None:
    env = _env(data_dir=tmp_path / "none")
    out = invoke(["--debug", "ope"], env)
    assert isinstance(out.exception, UserError), repr(out.exception)
    env["UNDERSTUDY_DEBUG"] = "1"
    assert isinstance(invoke(["ope"], env).exception, UserError)


# A bad argument for every command (and subcommand), with a word the message must contain.
# Typer's own usage errors print a framed box of about five lines; ours print two.
BAD_ARGUMENTS: list[tuple[list[str], str]] = [
    (["ope", "--since", "yesterday"], "--since"),
    (["ope", "--level", "2"], "--level"),
    (["ope", "--parquet", "/nonexistent-slice"], "--parquet"),
    (["evidence", "--level", "0"], "--level"),
    (["export", "--out", "{tmp}/x", "--workload-kind", "nosuch"], "--workload-kind"),
    (["replay", "--request-id", "r-1"], "--policy"),
    (["log", "retire", "--before", "soon"], "--before"),
    (["log", "verify", "--show", "many"], "--show"),
    (["log", "nosuch"], "nosuch"),
    (["db", "nosuch"], "nosuch"),
    (["protocol", "validate", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["protocol", "status", "no-version"], "ID@VERSION"),
    (["protocol", "schema", "/nonexistent-dir/schema.json"], "/nonexistent-dir/schema.json"),
    (["protocol", "approve", "p@1", "--reason", "r"], "--sha256"),
    (["train", "--episodes", "0"], "--episodes"),
    (["compare", "--scenarios", "nosuch"], "nosuch"),
    (["compare", "--planner-pessimism", "high"], "--planner-pessimism"),
    (["compare", "--from-manifest", "/nonexistent.json"], "/nonexistent.json"),
    (["sweep", "--families", "nosuch"], "--families"),
    (["sweep", "--seeds", "0"], "--seeds"),
    (["capacity", "--rate", "-1"], "--rate"),
    (["capacity", "--rate", "10", "--results", "/nonexistent-results"], "/nonexistent-results"),
    (["serve", "--log-level", "chatty"], "--log-level"),
    (["demo", "--episodes", "0"], "--episodes"),
    (["token-hash"], "token"),
    (["settings", "--verbose"], "--verbose"),
    (["nosuch"], "nosuch"),
]


@pytest.mark.parametrize(
    ("args", "named"), BAD_ARGUMENTS, ids=[" ".join(a[:2]) + f" {w}" for a, w in BAD_ARGUMENTS]
)
def test_a_bad_argument_is_refused_in_a_few_lines(
    args: list[str], named: str, tmp_path: Path
) -> None:
    missing = tmp_path / "no-data"
    out = invoke([a.replace("{tmp}", str(tmp_path)) for a in args], _env(data_dir=missing))
    check_short(out, most_lines=6)
    assert named in out.output, out.output
    assert not missing.exists()


def test_an_invalid_setting_names_its_variable(tmp_path: Path) -> None:
    env = {**_env(data_dir=tmp_path / "none"), "UNDERSTUDY_SCORER_MAX_BATCH": "lots"}
    out = invoke(["ope"], env)
    lines = check_short(out)
    assert "UNDERSTUDY_SCORER_MAX_BATCH" in lines[0], out.output


@pytest.mark.parametrize("service_url", ["http://127.0.0.1:1", "notaurl"])
@pytest.mark.parametrize(
    "args", [["protocol", "status"], ["protocol", "stop", "p@1", "--reason", "r"]]
)
def test_a_protocol_command_without_a_service_says_which_url(
    args: list[str], service_url: str, tmp_path: Path
) -> None:
    env = {**_env(data_dir=tmp_path / "none"), "UNDERSTUDY_URL": service_url}
    out = invoke(args, env)
    lines = check_short(out)
    assert out.exit_code == 3
    assert service_url in lines[0] and lines[1].startswith("fix: "), out.output
