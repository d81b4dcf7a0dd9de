#!/usr/bin/env python3
"""Public audit of the Cotangent study's records, with the Python standard library alone.

Usage: ``python analysis/public_audit.py [RECORDS_DIR ...] [--head SEQ:SHA256] [--anchor REMOTE]
[--allowed-signers FILE]`` (default: every folder under ``records/`` that holds a MANIFEST).
Runs as ``python -I -S analysis/public_audit.py`` too.

This file is the entry point. The audit is the standard-library package ``analysis/audit/``: its
``__init__.py`` lists every check (the threat model: docs/provenance.md), ``audit/folder.py`` runs
them in order for each folder that ``audit/cli.py`` (the command line) is given; the names below are re-exported for the tests and for ``harness``, which imports the core
through this module alone (``harness/records.py``, ``ledger.py``, ``freeze.py``, ``plan.py``, ``yamlio.py``). ``analysis`` imports the
package's rules as ``analysis.audit`` (the one home of each statistics rule).
"""

from __future__ import annotations

import os
import sys

# Under ``python -I`` this file's folder is not on sys.path: put it there to import the package
# ``audit`` as a top-level package; imported as a module (``analysis.public_audit``), leave
# sys.path as it was once the package is in.
_HERE = os.path.dirname(os.path.abspath(__file__))
_ADDED = _HERE not in sys.path
if _ADDED:
    sys.path.insert(0, _HERE)

from audit.attempts import (  # noqa: E402
    final_units,  # noqa: E402
    open_started,
    unfinished,
)
from audit.barrier import look_entry_records  # noqa: E402
from audit.budget import (  # noqa: E402
    Attempt,
    BudgetCheck,
    check,
    completeness_text,
    plan_units,
    stop_check,
)
from audit.carryover import blocks  # noqa: E402
from audit.cli import main  # noqa: E402
from audit.commands import arm_of, is_command_study, metric_of, refs_of  # noqa: E402
from audit.decisions import decide, sensitivity  # noqa: E402
from audit.descriptive import endpoint, mean_interval, paired_values  # noqa: E402
from audit.evidence import (  # noqa: E402
    EVIDENCE_SUFFIX,
    MAX_EVIDENCE_BYTES,
    Derived,
    EvidenceError,
    derive,
    evidence_problems,
)
from audit.freeze import field_differences, torch_matches  # noqa: E402
from audit.hypotheses import (  # noqa: E402
    CHOICES,
    Family,  # noqa: E402
    family_problems,
    rule_problems,
)
from audit.ledger import (  # noqa: E402
    LOOK_SUFFIX,
    RECORD_SUFFIX,
    STARTED_SUFFIX,
    canonical,
    check_ledger,
    entry_problems,
    is_snapshot_name,
    protocol_stub,
    record_name,
    self_hash_ok,
    sha256,
    snapshot_name,
    snapshot_of,
    with_snapshot,
)
from audit.looks import look_units  # noqa: E402
from audit.order import by_device, drift  # noqa: E402
from audit.plan import expected_summary, plan_from_protocol  # noqa: E402
from audit.planted import CONTEXT_FREE, KINDS, describe, plant_problems  # noqa: E402
from audit.ranks import signed_rank, upper_tail_count  # noqa: E402
from audit.recompute import compare, recompute  # noqa: E402
from audit.sequential import looks_problems  # noqa: E402
from audit.tag import FREEZE_MARKER, frozen_trees, is_exempt, parse_manifest  # noqa: E402
from audit.tdist import student_t_ppf, t_critical  # noqa: E402
from audit.yamlsub import YamlError, yaml_subset  # noqa: E402

if _ADDED:
    sys.path.remove(_HERE)

__all__ = [
    "blocks",
    "EVIDENCE_SUFFIX",
    "MAX_EVIDENCE_BYTES",
    "Derived",
    "EvidenceError",
    "derive",
    "evidence_problems",
    "arm_of",
    "is_command_study",
    "metric_of",
    "refs_of",
    "entry_problems",
    "torch_matches",
    "CHOICES",
    "family_problems",
    "rule_problems",
    "looks_problems",
    "look_units",
    "Family",
    "FREEZE_MARKER",
    "RECORD_SUFFIX",
    "LOOK_SUFFIX",
    "final_units",
    "look_entry_records",
    "STARTED_SUFFIX",
    "is_snapshot_name",
    "protocol_stub",
    "snapshot_name",
    "snapshot_of",
    "with_snapshot",
    "canonical",
    "check_ledger",
    "frozen_trees",
    "is_exempt",
    "open_started",
    "parse_manifest",
    "record_name",
    "self_hash_ok",
    "sha256",
    "unfinished",
    "Attempt",
    "BudgetCheck",
    "YamlError",
    "check",
    "completeness_text",
    "plan_units",
    "stop_check",
    "field_differences",
    "by_device",
    "compare",
    "decide",
    "drift",
    "endpoint",
    "expected_summary",
    "mean_interval",
    "main",
    "paired_values",
    "plan_from_protocol",
    "CONTEXT_FREE",
    "KINDS",
    "describe",
    "plant_problems",
    "recompute",
    "sensitivity",
    "signed_rank",
    "student_t_ppf",
    "t_critical",
    "upper_tail_count",
    "yaml_subset",
]

if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:  # the reader closed the pipe (| head): not an error of the audit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 141
    sys.exit(status)
