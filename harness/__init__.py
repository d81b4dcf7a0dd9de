"""The Cotangent study harness: preregistered paired-seed experiments on training speed.

Public entry points: :mod:`cotangent` (the method), ``harness`` (the command line).
"""

__version__ = "0.1.0"
