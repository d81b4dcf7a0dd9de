#!/usr/bin/env python3
"""Public audit of the Cotangent study's records, with the Python standard library alone.

Usage: ``python analysis/public_audit.py [RECORDS_DIR ...] [--head SEQ:SHA256] [--anchor REMOTE]
[--allowed-signers FILE]`` (default: every folder under ``records/`` that holds a MANIFEST).
Runs as ``python -I -S analysis/public_audit.py`` too, and as ``python -m audit``.

This file is the entry point and nothing imports it. The audit is the package ``audit/`` (its
command line, the folder's checks, the tag's signature and anchors, the published texts) over the
core ``prereg/`` (the records format and every rule), both standard library only. A script run by
its path has only its own folder on ``sys.path`` (and under ``-I`` not even that), so this file, and
nothing else of the project, puts the repository's root there: the packages then load once, under
their one name.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from audit.cli import entry  # noqa: E402

if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
