"""The published texts: ``report.md`` (:mod:`.report`) and ``index.html`` (:mod:`.page`) rendered
from a study's :class:`prereg.results.Summary`, standard library only, so the public audit renders
them again with the same code (:mod:`.published`)."""
