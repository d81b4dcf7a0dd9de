"""``python -m audit``: the public audit (:mod:`audit.cli`)."""

import sys

from audit.cli import entry

sys.exit(entry(sys.argv[1:]))
