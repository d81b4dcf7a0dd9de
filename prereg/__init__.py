"""The core of the Cotangent study harness, standard library only.

The formats of the files (``formats``: ``record``, a run's record and the chain's entries, typed;
``summary``, a records folder's summary; ``ledger``, canonical JSON, hashes and the chain;
``jsonfields``, the field checks at the JSON boundary), and
beside them ``files``, ``bounded``, ``errors``, ``tag``, ``corpora``, ``commands``, ``evidence``,
``interference``; the protocol, read once (``protocol``: ``read``, the one reader of a protocol
file, ``schema``, each key declared once, ``model``, the typed ``Protocol`` and ``Study``; over
``yamlsub`` and ``yamlflow``, the YAML subset reader); the protocol's rules and the plan (``plan``,
the named defaults, the plan and the protocol summary from the typed protocol, the tally;
``hypotheses``, ``planted``, ``stalls``, ``calibrated``, ``replicates``, ``attempts``, ``budget``,
``failstop``, ``barrier``); the designs (``designs``: the ``Design`` interface, its registry and the
paired, lockstep and factorial designs); the statistics (``tdist``, ``descriptive``, ``ranks``,
``ttests``, ``decisions``, ``sequential``, ``looks``, ``order``, ``factorial``, ``carryover``), whose
results carry their interval's level; the summary (``recompute``, ``results``); and the published
texts (``render``), from the typed summary.

The harness (``harness/``: it resolves on top of the typed protocol what needs the file system or
torch), the report (``analysis/``) and the public audit (``audit/``, entry point
``analysis/public_audit.py``) all call it, so each rule has one home; it imports nothing of the
project's and nothing outside the standard library, so the audit runs on a bare Python
(``python -I -S analysis/public_audit.py``). ``docs/layout.md`` says what each module holds.
"""
