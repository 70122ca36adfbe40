"""Evidence packages: the protocol, its hash, the event timeline and each criterion's trajectory.

Pure report building (Markdown, self-contained HTML, PNG plots with
matplotlib's Agg backend); the evaluator stores a snapshot of the package
with every verdict it records (``evidence_snapshots``). See docs/evaluator.md.
"""

from service.reports.protocol.package import FORMAT, EvidencePackage, Judged, build_package

__all__ = ["FORMAT", "EvidencePackage", "Judged", "build_package"]
