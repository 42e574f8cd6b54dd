"""The audit of a run: which samples each rank trained, checked for exactly once.

- :mod:`rankwise.train.audit.log`: :class:`AuditLog`, the opt-in trainer callback that writes
  one JSONL file per rank and attempt, and :func:`read_audit`, which reads a folder back into
  an :class:`AuditReport` whose ``violations()`` is the exactly-once verdict;
- :mod:`rankwise.train.audit.timeline`: the same folder as a timeline of who trained which
  step when, who was lost and who rejoined, which ``rankwise audit DIR`` prints and ``--plot``
  draws (matplotlib, imported only there).

>>> from rankwise.train.audit import AuditLog, read_audit
"""

from rankwise.train.audit.log import (
    Attempt,
    AuditLog,
    AuditReport,
    commit_limits,
    padding,
    read_audit,
    read_audit_files,
)

__all__ = [
    "Attempt",
    "AuditLog",
    "AuditReport",
    "commit_limits",
    "padding",
    "read_audit",
    "read_audit_files",
]
