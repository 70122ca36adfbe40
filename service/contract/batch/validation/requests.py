"""The driver: each request's verdict as `validate_request` gives it, by index.

`validate_batch` checks the whole batch's layout, then runs the rule families
(one module each) in validate_request's order; a request is refused by the
first rule it breaks, and a later rule only decides requests still clean
(`_Verdicts`). The combination is a class built from the families' classes, so
each family's rules stay methods over the pass's shared facts (`context._Pass`).
"""

from __future__ import annotations

import numpy as np

from service.contract.batch import RequestBatch
from service.contract.batch.validation.layout import check_layout
from service.contract.batch.validation.options import _OptionRules
from service.contract.batch.validation.production import _ProductionRules
from service.contract.batch.validation.request_fields import _RequestFieldRules
from service.contract.batch.validation.schema import _SchemaRules
from service.contract.batch.validation.snapshot import _SnapshotRules
from service.contract.batch.validation.support import _SupportRules
from service.contract.batch.validation.texts import _TextRules
from service.contract.batch.validation.verdicts import BatchVerdict
from service.contract.errors import UnsupportedSchemaVersion
from service.contract.request import SUPPORTED_SCHEMA_VERSIONS
from service.contract.schema_versions import V1_SCHEMA
from service.contract.validation import RequestLimits


def validate_batch(batch: RequestBatch, limits: RequestLimits | None = None) -> BatchVerdict:
    """Each request's verdict as `validate_request` gives it, by index (module docstring).

    Raises:
        InvalidInput: the batch's columns cannot be read into requests (`check_layout`).
    """
    limits = limits or RequestLimits()
    check_layout(batch)
    return _Run(batch, limits).run()


class _Run(
    _SchemaRules,
    _RequestFieldRules,
    _SnapshotRules,
    _OptionRules,
    _ProductionRules,
    _TextRules,
    _SupportRules,
):
    """One validation pass: the batch's columns, facts shared by several rules, and
    the rules in validate_request's order (one rule family per module)."""

    def run(self) -> BatchVerdict:
        if self.n == 0:
            return self.v.verdict()
        if self.b.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
            version = self.b.schema_version
            self.v.request(
                np.ones(self.n, np.bool_),
                lambda r: (
                    "schema_version",
                    f"must be one of {sorted(SUPPORTED_SCHEMA_VERSIONS)}, got {version}",
                ),
                UnsupportedSchemaVersion,
            )
            return self.v.verdict()
        if self.b.schema_version == V1_SCHEMA:
            self.schema_1()
        self.ids_and_time()
        self.state()
        self.workload()
        self.options()
        self.production()
        self.quota()
        self.texts()
        self.support()
        return self.v.verdict()
