"""``understudy protocol ...``: validate locally, and move protocols through the service.

Every command that changes or reads recorded protocols talks to a running
service over HTTP with a bearer token, so roles, owners and the independence
of approval are checked in one place (the service), whoever runs the CLI.
``validate`` and ``schema`` work offline.

    understudy protocol validate protocols/gavel-scorer-shadow.yaml
    understudy protocol submit   protocols/gavel-scorer-online.yaml --reason "ready for review"
    understudy protocol approve  gavel-scorer-online@1 --sha256 <hash> --reason "..."   (safety)
    understudy protocol start    protocols/gavel-scorer-online.yaml --reason "..."
    understudy protocol stop     gavel-scorer-online@1 --reason "..."
    understudy protocol status   [gavel-scorer-online@1]
    understudy protocol schema   protocols/schema.json [--check]

``UNDERSTUDY_URL`` and ``UNDERSTUDY_TOKEN`` supply ``--url`` and ``--token``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console

from service.cli.errors import GuardedGroup, UserError
from service.contract.errors import InvalidInput

protocol_app = typer.Typer(
    cls=GuardedGroup,
    help="Predeclared experiment protocols: validate, submit, approve, start, stop, status.",
    no_args_is_help=True,
)
console = Console(highlight=False)

URL = typer.Option("http://127.0.0.1:8080", "--url", envvar="UNDERSTUDY_URL", help="Service URL.")
TOKEN = typer.Option("", "--token", envvar="UNDERSTUDY_TOKEN", help="Bearer token.")
REASON = typer.Option(..., "--reason", help="Why: recorded with the event.")


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        console.print(f"[red]cannot read {path}: {exc}[/]")
        raise typer.Exit(2) from exc


def _ref(ref: str) -> tuple[str, int]:
    protocol_id, _, version = ref.rpartition("@")
    if not protocol_id or not version.isdigit():
        console.print(f"[red]`{ref}` must be ID@VERSION, e.g. gavel-scorer-online@1[/]")
        raise typer.Exit(2)
    return protocol_id, int(version)


def _call(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """One request; a refusal prints the service's message and exits 1."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            response = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise UserError(
            f"cannot reach the service at {url} (--url / UNDERSTUDY_URL): {exc}",
            fix="start it with `understudy serve`, or point UNDERSTUDY_URL at a running one",
            exit_code=3,
        ) from exc
    if response.status_code >= 400:
        try:
            detail = response.json()
            message = detail.get("message") or detail
        except ValueError:
            message = response.text
        console.print(f"[red]refused ({response.status_code}): {message}[/]")
        raise typer.Exit(1)
    return response.json()


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_record(record: dict[str, Any]) -> None:
    console.print(
        f"{record['protocol_id']}@{record['version']}: [bold]{record['state']}[/]"
        f" ({record['mode']}) sha256 {record['content_sha256']}"
    )


def _print_findings(findings: list[dict[str, Any]]) -> None:
    for f in findings:
        colour = "red" if f["severity"] == "error" else "yellow"
        console.print(f"[{colour}]{f['severity']}[/] `{f['field']}`: {f['message']}")


@protocol_app.command()
def validate(
    path: Annotated[Path, typer.Argument(help="Protocol file (YAML).")],
    policies_dir: Annotated[
        Path, typer.Option(help="Registered policies, for offline checks.")
    ] = Path("policies"),
    remote: bool = typer.Option(False, help="Ask the service (also checks production's logs)."),
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Parse and check a protocol; print its lock hash and every finding."""
    from service.protocols import ProtocolInvalid, validate_document
    from service.server.policy_refs import policy_refs_from_directory

    document = _read(path)
    if remote:
        result = _call(url, token, "POST", "/v1/protocols/validate", {"document": document})
    else:
        try:
            v = validate_document(
                document, policies=policy_refs_from_directory(policies_dir), logging=None
            )
            result = {
                "valid": True,
                "content_sha256": v.content_sha256,
                "findings": [
                    {"severity": f.severity.value, "field": f.field, "message": f.message}
                    for f in v.warnings
                ],
            }
        except ProtocolInvalid as exc:
            findings = [
                {"severity": f.severity.value, "field": f.field, "message": f.message}
                for f in exc.findings
            ]
            result = {"valid": False, "findings": findings}
        except InvalidInput as exc:
            message = {"severity": "error", "field": exc.field, "message": str(exc)}
            result = {"valid": False, "findings": [message]}
    _print_findings(result["findings"])
    if not result["valid"]:
        console.print(f"[red]{path}: invalid[/]")
        raise typer.Exit(1)
    console.print(f"[green]{path}: valid[/], content sha256 {result['content_sha256']}")


@protocol_app.command()
def submit(
    path: Annotated[Path, typer.Argument(help="Protocol file (YAML).")],
    reason: str = typer.Option("", "--reason", help="Why: recorded with the event."),
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Record a draft (admin, owner); its content is locked from now on."""
    body = {"document": _read(path), "reason": reason}
    _print_record(_call(url, token, "POST", "/v1/protocols", body))


@protocol_app.command()
def approve(
    ref: str = typer.Argument(..., help="ID@VERSION."),
    sha256: str = typer.Option(..., "--sha256", help="The content hash you reviewed."),
    reason: str = REASON,
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Approve exactly the reviewed content (safety role, not an owner)."""
    pid, version = _ref(ref)
    body = {"content_sha256": sha256, "reason": reason}
    _print_record(
        _call(url, token, "POST", f"/v1/protocols/{pid}/versions/{version}/approve", body)
    )


@protocol_app.command()
def start(
    target: str = typer.Argument(..., help="Protocol file, or ID@VERSION if already recorded."),
    reason: str = REASON,
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Start (admin, owner); a file must match the locked content exactly."""
    document = None
    if Path(target).is_file():
        document = _read(Path(target))
        if not isinstance(document, dict) or "id" not in document or "version" not in document:
            console.print(f"[red]{target}: not a protocol with `id` and `version`[/]")
            raise typer.Exit(2)
        pid, version = str(document["id"]), document["version"]
    else:
        pid, version = _ref(target)
    body = {"reason": reason, "document": document}
    _print_record(_call(url, token, "POST", f"/v1/protocols/{pid}/versions/{version}/start", body))


@protocol_app.command()
def stop(
    ref: str = typer.Argument(..., help="ID@VERSION."),
    reason: str = REASON,
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Stop a running protocol, or withdraw a draft or approved one (admin, safety)."""
    pid, version = _ref(ref)
    path = f"/v1/protocols/{pid}/versions/{version}/stop"
    _print_record(_call(url, token, "POST", path, {"reason": reason}))


@protocol_app.command()
def status(
    ref: str = typer.Argument("", help="ID@VERSION; empty lists every protocol."),
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """A protocol's state and event timeline, or the list of recorded protocols."""
    if not ref:
        records = _call(url, token, "GET", "/v1/protocols")
        for record in records:
            _print_record(record)
        if not records:
            console.print("no protocols recorded")
        return
    pid, version = _ref(ref)
    result = _call(url, token, "GET", f"/v1/protocols/{pid}/versions/{version}")
    _print_record(result["record"])
    for e in result["events"]:
        criterion = f" [{e['criterion']}]" if e["criterion"] else ""
        console.print(
            f"  {e['seq']:>3}  {_when(e['at'])}  {e['action']:<15}"
            f" {e['from_state'] or '-'} -> {e['to_state']}  by {e['actor']} ({e['actor_role']})"
            f"{criterion}: {e['reason']}",
            soft_wrap=True,
        )


@protocol_app.command()
def schema(
    path: Annotated[Path, typer.Argument(help="Where the schema lives.")] = Path(
        "protocols/schema.json"
    ),
    check: bool = typer.Option(False, help="Fail if the file is stale instead of writing it."),
) -> None:
    """Write the protocol JSON Schema for editors (or check the committed one)."""
    from service.protocols.jsonschema import main

    code = main([str(path), "--check"] if check else [str(path)])
    if code:
        raise typer.Exit(code)
