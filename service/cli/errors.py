"""The CLI's one boundary for user errors: what is wrong, where it looked, what fixes it.

A newcomer's first mistakes — no decision log in the data directory, a URL
that does not parse or does not answer, a missing file, a bad option value —
must read as two lines, not as a traceback. Commands raise what they raise
(domain errors from `service.contract.errors`, `OSError`, SQLAlchemy's
errors); `GuardedGroup`, the class of the app's groups, translates them at the
edge, the way httpx maps a dependency's exceptions in its transports::

    Exception
     ├── UserError                 raised here: message + fix + exit code
     ├── UnderstudyError           domain errors: their message, exit 1
     │    ├── InvalidInput         exit 2
     │    └── Unavailable          "cannot reach": exit 3
     ├── sqlalchemy ArgumentError  URL does not parse: exit 2
     ├── sqlalchemy ProgrammingError (undefined table)  schema missing: exit 1
     ├── pydantic ValidationError  an UNDERSTUDY_* setting is invalid: exit 2
     ├── OSError with a filename   cannot read/write that path: exit 2
     ├── ValueError                a bad value the code refused: exit 2
     └── anything else             a bug: one line, exit 1, `--debug` shows it

Exit codes: 1 nothing to work on (or a refusal), 2 bad input, 3 a dependency
is unreachable. ``--debug`` (or ``UNDERSTUDY_DEBUG=1``) re-raises instead.

`decision_log_url` is the check every read command runs first: it finds out
whether the decision log is there without creating anything (no data
directory made, no ``initdb``; an embedded server it had to start just to
look is stopped again).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

from service.contract.errors import InvalidInput, Unavailable, UnderstudyError
from service.settings import Settings

DEMO_DATA_DIR = Path("out/demo")
"""Where `make demo` (``understudy demo``) leaves its decision log."""

_stderr = Console(stderr=True, highlight=False)
_command: ContextVar[tuple[str, ...]] = ContextVar("understudy_command", default=())
"""The subcommand names resolved so far (``("log", "seal")``), for `command_name`."""


class UserError(Exception):
    """Raised by CLI code when the user can fix the problem; printed without a traceback.

    Attributes:
        message: what is wrong and where it looked (data directory, URL, file).
        fix: the command or setting that fixes it ("" when there is none to give).
        exit_code: 1 nothing to work on, 2 bad input, 3 a dependency unreachable.
    """

    def __init__(self, message: str, fix: str = "", exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code


@contextmanager
def quiet_startup() -> Iterator[None]:
    """Start-up noise inside the block as the demo shows it (`service.cli.demo_noise`): the
    CUDA-asked, CPU-used warnings as one line on stderr; the embedded server's
    "XDG_RUNTIME_DIR is not set" (it falls back to /tmp) not at all. `serve` keeps both."""
    from service.cli.demo_noise import collapsed_noise

    with collapsed_noise(_stderr), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        yield


def command_name() -> str:
    """The running command as a user types it (``understudy ope``), for hints."""
    return " ".join(["understudy", *_command.get()])


def shown_url(url: str) -> str:
    """`url` with any password hidden, as it may appear in a message."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def place(settings: Settings) -> str:
    """Where the configured decision log lives, in words: URL or data directory."""
    if settings.database_url:
        return f"UNDERSTUDY_DATABASE_URL={shown_url(settings.database_url)}"
    return f"UNDERSTUDY_DATA_DIR={settings.data_dir}"


def _demo_fix(settings: Settings) -> str:
    command = command_name()
    demo = DEMO_DATA_DIR
    if (demo / "postgres" / "PG_VERSION").is_file() and Path(settings.data_dir) != demo:
        return f"the demo's log is in {demo}: `UNDERSTUDY_DATA_DIR={demo} {command}`"
    return (
        f"run `make demo`, then `UNDERSTUDY_DATA_DIR={demo} {command}`; "
        "or set UNDERSTUDY_DATABASE_URL / UNDERSTUDY_DATA_DIR to the service's log"
    )


def parse_database_url(url: str) -> str:
    """`url` if SQLAlchemy can parse it, else a `UserError` naming the setting (exit 2)."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except ArgumentError as exc:
        raise UserError(
            f"UNDERSTUDY_DATABASE_URL={url!r} is not a database URL",
            fix="expected postgresql+psycopg://USER@HOST:PORT/DB, or unset it for the "
            "embedded database in UNDERSTUDY_DATA_DIR",
            exit_code=2,
        ) from exc
    return url


def decision_log_url(settings: Settings) -> str:
    """The URL of the configured decision log, after checking that the log is there.

    Creates nothing: a data directory without a database is reported, not
    initialised. An embedded server that was not running is started to look
    and stopped again when there is no log in it (the command then exits).

    Raises:
        UserError: no database, no decision-log schema in it, or a bad URL.
        Unavailable: the database does not answer.
    """
    from service.storage import running_pid, start_embedded, stop_embedded
    from service.storage.admin import EMBEDDED_SUBDIR

    if settings.database_url:
        url = parse_database_url(settings.database_url)
        _check_schema(url, settings)
        return url
    pg_dir = Path(settings.data_dir) / EMBEDDED_SUBDIR
    if not (pg_dir / "PG_VERSION").is_file():
        raise UserError(
            f"no decision log in `{settings.data_dir}` (UNDERSTUDY_DATA_DIR): "
            f"there is no database in `{pg_dir}`",
            fix=_demo_fix(settings),
        )
    started_here = running_pid(pg_dir) is None
    try:
        with quiet_startup():
            url = start_embedded(pg_dir).url()
    except RuntimeError as exc:
        raise UserError(str(exc), fix=f"see the server log in `{pg_dir}/log`") from exc
    try:
        _check_schema(url, settings)
    except (UserError, Unavailable):
        if started_here:
            stop_embedded(pg_dir)
        raise
    return url


def _check_schema(url: str, settings: Settings) -> None:
    """`UserError` when the database holds no decision log; a warning when on another revision."""
    from sqlalchemy import create_engine, pool

    from service.storage import current_revision, head_revision
    from service.storage.engine import CONNECT_TIMEOUT_S

    engine = create_engine(
        url, poolclass=pool.NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
    )
    try:
        revision = current_revision(engine)
    finally:
        engine.dispose()
    if revision is None:
        fix = (
            _demo_fix(settings)
            if not settings.database_url
            else "point UNDERSTUDY_DATABASE_URL at the service's database, "
            "or create the schema with `understudy db upgrade`"
        )
        raise UserError(f"no decision log in the database at {place(settings)} (no tables)", fix)
    head = head_revision()
    if revision != head:
        _stderr.print(
            f"[yellow]warning: the decision log at {place(settings)} is at schema revision "
            f"{revision}, this build expects {head}; `understudy db upgrade` migrates it[/]"
        )


def explain(exc: Exception) -> UserError:
    """The short form of `exc`: message, fix and exit code (see the module docstring)."""
    from pydantic import ValidationError
    from sqlalchemy.exc import ArgumentError, ProgrammingError

    if isinstance(exc, UserError):
        return exc
    settings_place = _settings_place()
    if isinstance(exc, Unavailable):
        return UserError(_first_line(exc), f"check that the database at {settings_place} is up", 3)
    if isinstance(exc, UnderstudyError):
        return UserError(_first_line(exc), exit_code=2 if isinstance(exc, InvalidInput) else 1)
    if isinstance(exc, ArgumentError):
        return UserError(f"bad database URL ({settings_place}): {_first_line(exc)}", exit_code=2)
    if isinstance(exc, ProgrammingError) and "does not exist" in str(exc.orig):
        return UserError(
            f"the database at {settings_place} lacks part of the decision log: "
            f"{_first_line(exc.orig)}",
            "`understudy db upgrade` migrates it to this build's schema",
        )
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"UNDERSTUDY_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        )
        return UserError(f"invalid setting {problems}", "`understudy settings` lists them", 2)
    if isinstance(exc, OSError) and exc.filename is not None:
        return UserError(f"cannot use `{exc.filename}`: {exc.strerror or exc}", exit_code=2)
    if isinstance(exc, ValueError):
        return UserError(_first_line(exc), exit_code=2)
    return UserError(
        f"unexpected error: {type(exc).__name__}: {_first_line(exc)}",
        "this is a bug: rerun with `--debug` (or UNDERSTUDY_DEBUG=1) and report the traceback",
    )


def _settings_place() -> str:
    try:
        return place(Settings())
    except Exception:  # the settings themselves are broken: say so elsewhere
        return "UNDERSTUDY_DATABASE_URL / UNDERSTUDY_DATA_DIR"


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def report(problem: UserError) -> NoReturn:
    """Print `problem` on stderr (one line, plus one for the fix) and exit with its code."""
    _stderr.print(f"[red]error:[/] {problem.message}", soft_wrap=True)
    if problem.fix:
        _stderr.print(f"[bold]fix:[/] {problem.fix}", soft_wrap=True)
    raise typer.Exit(problem.exit_code)


def debugging(ctx: typer.Context) -> bool:
    """Whether ``--debug`` or ``UNDERSTUDY_DEBUG`` asks for tracebacks."""
    flag = ctx.find_root().params.get("debug")
    env = os.environ.get("UNDERSTUDY_DEBUG", "").strip().lower()
    return bool(flag) or env in {"1", "true", "yes", "on"}


class GuardedGroup(TyperGroup):
    """The app's groups: every exception a command lets out becomes `report`'s short form.

    Typer's own exceptions (usage errors, `typer.Exit`, `typer.Abort`) pass
    through: typer already prints those without a traceback. Subgroups use it
    too, so that hints name the whole command (``understudy log seal``).
    """

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """Resolve as usual, and remember the name for the hints."""
        name, command, rest = super().resolve_command(ctx, args)
        _command.set((*(_command.get() if ctx.parent else ()), name or ""))
        return name, command, rest

    def invoke(self, ctx: Any) -> Any:
        """Run the subcommand; translate what escapes it unless debugging."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as exc:
            if debugging(ctx):
                raise
            report(explain(exc))
