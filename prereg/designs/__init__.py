"""The designs (standard library only): what a design is (:mod:`.base`), the built-in designs
(:mod:`.paired`, :mod:`.lockstep`, :mod:`.factorial`), the registry that names them
(:mod:`.registry`), and whether two designs measure the same effect (:mod:`.difference`)."""

from prereg.designs.base import Design
from prereg.designs.difference import DesignDifference, welch_difference
from prereg.designs.factorial import FACTORIAL
from prereg.designs.lockstep import LOCKSTEP
from prereg.designs.paired import PAIRED
from prereg.designs.registry import (
    DesignError,
    design_label,
    design_named,
    design_names,
    find_design,
    register,
    study_design,
    unregister,
)

__all__ = [
    "FACTORIAL",
    "LOCKSTEP",
    "PAIRED",
    "Design",
    "DesignDifference",
    "DesignError",
    "design_label",
    "design_named",
    "design_names",
    "find_design",
    "register",
    "study_design",
    "unregister",
    "welch_difference",
]
