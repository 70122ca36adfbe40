"""Evidence packages: protocol and hash, event timeline, criteria, one plot per criterion."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from service.protocols import (
    Action,
    ActorRole,
    Identity,
    Mode,
    ProtocolEvent,
    RecordedProtocol,
    State,
    content_hash,
    parse_protocol,
    to_document,
)
from service.protocols.criteria import Evaluation, Role, Status
from service.reports.protocol import FORMAT, build_package
from tests.evaluator.conftest import protocol_doc

PNG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Stored:
    evaluation: Evaluation
    evaluated_at: float


def _record() -> RecordedProtocol:
    protocol = parse_protocol(protocol_doc())
    return RecordedProtocol(
        protocol_id=protocol.id,
        version=1,
        content_sha256=content_hash(protocol),
        document=to_document(protocol),
        mode=Mode.SHADOW,
        owners=("alice",),
        submitted_by="alice",
        state=State.STOPPED,
        seq=3,
        recorded_at=1.0e9,
        updated_at=1.0e9 + 7200,
        started_at=1.0e9 + 60,
    )


def _event(
    seq: int, action: Action, to: State, who: Identity, criterion: str | None
) -> ProtocolEvent:
    lease = {"lease": {"holder": "h", "generation": 4}} if who.role is ActorRole.SYSTEM else {}
    return ProtocolEvent("sim-harm", 1, seq, action, None if seq == 1 else State.RUNNING, to,
                         who.principal, who.role.value, f"{action.value} | why", lease, criterion,
                         "x", 1.0e9 + 3600 * seq)  # fmt: skip


def _history() -> list[Stored]:
    """reward-harm at 100 (too few), 300, 600 (pending) and 900 rounds (fired)."""
    out = []
    for i, n in enumerate((100, 300, 600, 900)):
        half = 0.5 / n**0.5
        value = None if n < 200 else -0.05 - 0.01 * i
        status = Status.INSUFFICIENT if n < 200 else Status.PENDING if n < 900 else Status.FIRED
        lower = None if value is None else value - half
        upper = None if value is None else value + half
        e = Evaluation(
            "reward-harm", Role.STOP, "reward", status, value, upper, 0.0, lower, upper, n, 0.05,
            "asymptotic-cs",
        )  # fmt: skip
        out.append(Stored(e, 1.0e9 + 600 * (i + 1)))
    return out


def test_the_package_has_protocol_hash_timeline_criteria_and_plots(tmp_path: Path) -> None:
    record = _record()
    admin = Identity("alice", ActorRole.ADMIN)
    system = Identity("understudy-evaluator", ActorRole.SYSTEM)
    events = [
        _event(1, Action.SUBMIT, State.DRAFT, admin, None),
        _event(2, Action.START, State.RUNNING, admin, None),
        _event(3, Action.STOP, State.STOPPED, system, "reward-harm"),
    ]
    package = build_package(record, events, _history())
    md = package.markdown
    assert record.content_sha256 in md and "| 3 |" in md and "reward-harm" in md
    assert (
        "understudy-evaluator (system)" in md
        and "![reward-harm.png](figures/reward-harm.png)" in md
    )
    assert '"minimum_samples": 200' in md  # the locked document itself
    assert package.figures["reward-harm.png"].startswith(PNG)
    assert "data:image/png;base64," in package.html and "&lt;" not in record.content_sha256
    summary = package.summary
    assert summary["format"] == FORMAT and summary["state"] == "stopped"
    assert summary["verdict"]["lease"] == {"holder": "h", "generation": 4}
    assert summary["criteria"]["reward-harm"]["status"] == "fired"
    path = package.write(tmp_path / "evidence")
    assert path.read_text() == md
    assert (tmp_path / "evidence" / "figures" / "reward-harm.png").read_bytes().startswith(PNG)
    assert json.loads((tmp_path / "evidence" / "summary.json").read_text())["events"] == 3


def test_no_numbers_yet_means_no_plot() -> None:
    package = build_package(_record(), [], _history()[:1])
    assert package.figures == {} and "(no numbers yet)" in package.markdown
