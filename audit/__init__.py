"""The public audit, standard library only, over the core :mod:`prereg`.

Entry points: ``python analysis/public_audit.py`` and ``python -m audit``. Its modules: ``cli`` (the
command line), ``folder`` (every check of one records folder, in order), ``freeze`` (what ran is
what was frozen), ``anchors`` (the tag's signature and the ledger's anchors) and ``published``
(report.md and index.html rendered again). The threat model is docs/provenance.md."""
