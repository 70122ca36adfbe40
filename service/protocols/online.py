"""What Runtime reports during online-bounded experiments, and the authority check.

Understudy never acts; in an online-bounded experiment Runtime does, on a
bounded slice, with the exact artifact the protocol pins. Runtime reports each
placement it made on the candidate's decision (`ActedPlacement`) and its own
request counters (`RuntimeRequestCount`, for mirror coverage). The wire form
is ``protos/understudy/v1/online.proto``, field for field.

`authority_breaches` is the per-placement check the evaluator runs: any breach
is a rollback *signal* (event, metric, API state), never a command. The
traffic fraction is an aggregate over many placements and is the evaluator's
to estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.protocols.schema import Mode, Protocol


@dataclass(frozen=True, slots=True)
class ActedPlacement:
    """One placement Runtime made on a candidate's decision.

    Attributes:
        request_id: the mirrored request it answered.
        protocol_id: the online-bounded protocol it ran under.
        protocol_version: its version.
        policy_name: the policy Runtime ran.
        policy_version: its version.
        policy_sha256: the artifact's sha256, as Runtime loaded it.
        option: index into the request's options; -1 = deferred.
        pool: hardware class of the placed option.
        workload_kind: the workload's kind (a `WorkloadKind` value).
        acted_at: Unix seconds, Runtime's clock.
        concurrent_placements: live placements of the experiment after this one.
    """

    request_id: str
    protocol_id: str
    protocol_version: int
    policy_name: str
    policy_version: str
    policy_sha256: str
    option: int
    pool: str
    workload_kind: str
    acted_at: float
    concurrent_placements: int


@dataclass(frozen=True, slots=True)
class RuntimeRequestCount:
    """Runtime's cumulative request counters since `instance_started_at`.

    Mirror coverage over an interval = mirrored requests Understudy accepted /
    the increase of `requests_total`; a changed `instance_started_at` means the
    counters restarted from zero.
    """

    runtime_instance: str
    instance_started_at: float
    reported_at: float
    requests_total: int
    mirrored_total: int
    client_shed_total: int


def authority_breaches(
    protocol: Protocol, placement: ActedPlacement, started_at: float
) -> tuple[str, ...]:
    """Every way `placement` exceeds the protocol's authority (empty: within it).

    Args:
        protocol: the protocol the placement claims to run under.
        placement: what Runtime reports it did.
        started_at: when the protocol started (Unix seconds), for the duration bound.
    """
    if protocol.mode is not Mode.ONLINE_BOUNDED or protocol.authority is None:
        return (f"protocol `{protocol.id}` is shadow: it grants no authority to act",)
    a = protocol.authority
    c = protocol.candidate
    out: list[str] = []
    if (placement.protocol_id, placement.protocol_version) != protocol.key:
        out.append(
            f"`protocol_id` {placement.protocol_id} v{placement.protocol_version} is not"
            f" {protocol.id} v{protocol.version}"
        )
    ran = (placement.policy_name, placement.policy_version, placement.policy_sha256)
    if ran != (c.name, c.version, c.sha256):
        out.append(
            f"`policy_sha256` Runtime ran {placement.policy_name}@{placement.policy_version}"
            f" ({placement.policy_sha256[:12]}), the protocol pins {c} ({(c.sha256 or '')[:12]})"
        )
    if placement.pool not in a.pools:
        out.append(f"`pool` {placement.pool!r} is not in `authority.pools` {list(a.pools)}")
    if placement.workload_kind not in a.workload_kinds:
        out.append(
            f"`workload_kind` {placement.workload_kind!r} is not in"
            f" `authority.workload_kinds` {list(a.workload_kinds)}"
        )
    if placement.concurrent_placements > a.max_concurrent_placements:
        out.append(
            f"`concurrent_placements` {placement.concurrent_placements} exceeds"
            f" `authority.max_concurrent_placements` {a.max_concurrent_placements}"
        )
    if placement.acted_at - started_at > a.max_duration_s:
        out.append(
            f"`acted_at` is {placement.acted_at - started_at:.0f} s after the start, beyond"
            f" `authority.max_duration` {a.max_duration_s:.0f} s"
        )
    return tuple(out)
