"""The published texts: ``report.md`` and ``index.html`` (:mod:`.page`) rendered from a study's
:class:`prereg.results.Summary` through one list of sections (:mod:`.model`), standard library only,
so the public audit renders them again with the same code (:func:`.page.published_texts`)."""
