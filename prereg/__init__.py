"""Public audit of the Cotangent study's records, with the Python standard library alone.

Usage: ``python analysis/public_audit.py [RECORDS_DIR ...] [--head SEQ:SHA256] [--anchor REMOTE]
[--allowed-signers FILE]`` (default: every folder under ``records/`` that holds a MANIFEST).
Runs as ``python -I -S analysis/public_audit.py`` too.

It checks, for each records folder (the threat model: docs/provenance.md):

1. every record's own sha256 (over its canonical JSON without the ``sha256`` field);
2. the MANIFEST: every record file listed with its sha256, no file missing or unlisted, and every
   source file's sha256 against the file in this checkout; from schema 4 on, each record's
   ``protocol`` stub names the folder's protocol snapshot (``protocol.<sha256>.json``, listed in
   MANIFEST) by the sha256 of its canonical JSON, and is read over it;
3. the study as the tag defines it: for a preregistered protocol (a tag ``protocol-<id>`` exists,
   or the checkout's file says ``preregistered: true``) the protocol is read from the tagged
   commit (the file whose sha256 the tag's freeze manifest names) with the audit's own YAML
   reader, and every copy of its fields in a record (and MANIFEST) must equal it; the plan and
   every statistic are derived from it, never from the records;
4. what ran is what was frozen: each record's commit holds the manifest's frozen trees, its code
   hash is the manifest's, MANIFEST lists the tagged sources, torch and numpy have one version
   per study (what else varies is named);
5. time order, with git's replace objects disabled: the tag was created before the earliest
   record started, and records start after their predecessors in the ledger chain (unless the two
   ran at once on different machines); no record finishes before it starts;
6. anchors: ``--head SEQ:SHA256`` (the full sha256) and ``--anchor REMOTE`` (the ledger heads
   ``harness run --anchor`` pushed) must be in the chain; ``--allowed-signers FILE`` verifies the
   tag's signature. Without any anchor the last line says so;
7. the ledger: records and started entries (schema 3: an attempt's ``*.started.json``, appended
   before its worker started) form one hash chain from the freeze manifest; every record that ends
   an attempt links to its started entry; an interrupted record charges no more device seconds
   than the ledger's time from its start to it; started entries with no record are listed as
   interrupted attempts with their start time; each unit is analysed from exactly one unit
   attempt (its latest), and superseded attempts are counted;
8. ``summary.json``: its own sha256, and every interval, count and decision in it, recomputed
   here from the records with an independent implementation (relative tolerance 1e-9).

It does not run training and does not check the weight files (they stay local); it says so.
Exit status 0 only if everything matched; otherwise 1, naming each file, field and value (2 for an
argument it cannot use).

The package, standard library only: ``cli`` (the command line), ``folder`` (one folder's checks
in order), ``ledger`` (hashes, records, the chain), ``tag`` (git, the tag, the protocol it names),
``freeze`` (protocol copies, what ran, time order), ``anchors`` (signature, anchored heads),
``corpora``, ``plan`` (the plan and protocol summary recomputed), ``yamlsub`` and ``yamlflow`` (the
YAML reader), ``tdist``, ``descriptive``, ``ranks`` (the signed-rank test), ``hypotheses`` (each
hypothesis' test), ``decisions`` (the family's decisions, sensitivity), ``attempts`` (which records
count, the flow, completeness), ``budget`` (the budget rule, which ``harness run`` and the summary
apply too) and ``recompute`` (``summary.json`` recomputed and compared).
"""
