"""The study's statistics: reads records, never imports torch.

``paired_interval`` is the public entry point for intervals; ``analysis.report`` writes the
report; ``analysis/public_audit.py`` re-checks everything with the standard library alone.
"""

from prereg.descriptive import PairedInterval, mean_interval, paired_interval
from prereg.factorial import factorial_contrasts

__all__ = ["PairedInterval", "factorial_contrasts", "mean_interval", "paired_interval"]
