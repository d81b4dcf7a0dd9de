"""The Cotangent study harness: preregistered paired-seed experiments on training speed.

Public entry points: :mod:`cotangent` (the method), ``harness`` (the command line).
"""

import sys

# The runner writes no bytecode into the repository (docs/provenance.md, "No bytecode, no hooks"):
# a cache it wrote could not be told from a planted one, and a run refuses both.
sys.dont_write_bytecode = True

__version__ = "0.1.0"
