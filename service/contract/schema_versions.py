"""What a schema-1 request may say: the one rule mapping version 1 onto version 2.

Version 1 is still accepted (docs/contract.md, "Versioning") and keeps its old
meaning: capability numbers are all known (an unset one on the protobuf wire
was how a 0 travelled, so the wire decoder reads it as 0), the workload kind is
one of the four the version-1 enum could say, and none of the version-2 fields
is set. Those fields change what a request means (devices, shares, open
vocabularies, production's distribution), so a version-1 request that sets one
is refused naming it rather than half-understood: the sender meant something
version 1 cannot say and must send ``schema_version = 2``.

Transport decoders apply the part that needs the wire (presence bits, the
protobuf `kind_name`); this module checks the rest on the decoded request, for
both transports alike.
"""

from __future__ import annotations

from service.contract.errors import InvalidInput
from service.contract.hardware import CAPABILITIES
from service.contract.request import MirrorRequest, ProductionDecision
from service.contract.workload import WorkloadKind

V1_SCHEMA = 1
"""The version whose unset capability numbers mean 0 and whose kind is the enum."""

V1_REFUSAL = "is a schema 2 field: a schema_version 1 request may not set it (send 2)"
"""The message for a schema-2 field in a schema-1 request (both transports)."""

_V1_KINDS = frozenset(k.value for k in WorkloadKind)


def _production_fields(production: ProductionDecision | None) -> str | None:
    if production is None:
        return None
    if production.probabilities is not None:
        return "production.probabilities"
    if production.defer_probability is not None:
        return "production.defer_probability"
    return None


def check_schema_1(request: MirrorRequest) -> None:
    """Raise `InvalidInput` naming the first schema-2 field a schema-1 `request` sets.

    Also refuses an unknown (None) capability, which only the HTTP form can carry
    (an omitted or null number; schema 1 required them) and an unknown kind.
    """
    s, w, o = request.state, request.workload, request.options
    for name in (
        "device_offsets",
        "device_hardware",
        "device_free_share",
        "device_free_memory_gb",
        "device_ids",
    ):
        if len(getattr(s, name)):
            raise InvalidInput(f"state.{name}", V1_REFUSAL)
    for i, hardware in enumerate(s.hardware):
        for name in CAPABILITIES:
            if getattr(hardware, name) is None:
                raise InvalidInput(
                    f"state.hardware[{i}].{name}",
                    "must be set in schema_version 1 (an unknown capability needs schema 2)",
                )
    if w.kind not in _V1_KINDS:
        raise InvalidInput(
            "workload.kind",
            f"must be train, finetune, infer or batch in schema_version 1, got {w.kind[:40]!r}",
        )
    if w.accelerator_share is not None:
        raise InvalidInput("workload.accelerator_share", V1_REFUSAL)
    if w.qos_class:
        raise InvalidInput("workload.qos_class", V1_REFUSAL)
    if o.names_devices or len(o.device_index):
        field = "options.device_offsets" if o.names_devices else "options.device_index"
        raise InvalidInput(field, V1_REFUSAL)
    production_field = _production_fields(request.production)
    if production_field is not None:
        raise InvalidInput(production_field, V1_REFUSAL)
