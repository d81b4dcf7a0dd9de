"""The core of the Cotangent study harness, standard library only.

The records format and the ledger (``records``, ``jsonfields``, ``files``, ``bounded``, ``errors``,
``ledger``, ``tag``, ``corpora``, ``commands``, ``evidence``, ``interference``); the protocol's
rules and the plan (``yamlsub`` and ``yamlflow``, the YAML subset reader; ``plan``, the protocol
keys' defaults and the plan; ``hypotheses``, ``planted``, ``replicates``, ``attempts``, ``budget``,
``failstop``, ``barrier``); the statistics (``tdist``, ``descriptive``, ``ranks``, ``ttests``,
``decisions``, ``sequential``, ``looks``, ``order``, ``factorial``, ``carryover``, ``designs``); the
summary (``recompute``, ``summary``, ``results``); and the published texts (``render``).

The harness (``harness/``), the report (``analysis/``) and the public audit (``audit/``, entry
point ``analysis/public_audit.py``) all call it, so each rule has one home; it imports nothing of
the project's and nothing outside the standard library, so the audit runs on a bare Python
(``python -I -S analysis/public_audit.py``). ``docs/layout.md`` says what each module holds.
"""
