"""Validation of a whole `RequestBatch` (or `OutcomeColumns`) by index (issue 24).

The same rules as `service.contract.validation.validate_request` (and what it
calls: device_validation, production, text, schema_versions, hardware) and
`validate_outcome`, computed as boolean arrays over the batch's rows (nodes,
hardware classes, devices, options, entries, named devices, probabilities,
strings, requests) instead of once per request. Each rule's rows are mapped to
the requests they belong to (snapshot rows through ``state_index``, option and
entry rows through the CSR offsets), and a request is refused by the *first*
rule it breaks in validate_request's order, naming the first offending element
as validate_request names it (``state.cpu_free[5]``, node index local to the
snapshot). A fault in a snapshot refuses every request that uses it with the
same field and message. Requests already refused by an earlier rule are not
looked at again, so a later rule only ever decides clean requests.

One module per rule family, each saying what it checks:

- `layout`: whole-batch structure (lengths, CSR offsets, state indexes): a
  fault raises `InvalidInput` for the whole batch (invariant 3), before any rule;
- `schema` (schema_version 1), `request_fields` (id, time, workload, quota),
  `snapshot` and `devices` (cluster states), `options`, `production`, `texts`,
  `support` (no mass on an infeasible option, via `joined`): the rules;
- `requests`: the driver, `validate_batch`, running them in order;
- `outcomes`: `validate_outcome_batch`;
- `verdicts`, `context`, `arrays`, `utf8`, `fields`: what the rules share.

What is a Python loop here, and why:

- over rules (fixed, ~120 of them);
- over *refused* requests, to build each refusal's message (one string each);
- over hardware classes (a handful per snapshot: they are `HardwareClass`
  objects, and `str.strip` is the whitespace rule of their names);
- over the strings of a string-equality comparison (allowed hardware classes,
  affinity labels) only when one of them is longer than `_PADDED_WIDTH` bytes
  (shorter ones, always in practice, are compared as fixed-width rows);
- over the node ids of a snapshot only when two distinct ids collide in the
  64-bit hash the duplicate rule sorts by (found by the byte comparison of
  every equal pair; a crafted collision costs a set, not a wrong refusal).

Production's support check (`check_request_support`: no probability on an
option the feasibility function masks) joins the feasibility function's
columns from the batch's columns (`joined_feasibility`) and evaluates them
with the code `check_feasibility_batch` runs (`feasibility_of_joined`).
"""

from service.contract.batch.validation.joined import joined_feasibility
from service.contract.batch.validation.layout import check_layout, check_outcome_layout
from service.contract.batch.validation.outcomes import validate_outcome_batch
from service.contract.batch.validation.requests import validate_batch
from service.contract.batch.validation.verdicts import BatchVerdict, IndexedRefusal, refusal_from

__all__ = [
    "BatchVerdict",
    "IndexedRefusal",
    "check_layout",
    "check_outcome_layout",
    "joined_feasibility",
    "refusal_from",
    "validate_batch",
    "validate_outcome_batch",
]
