"""The protocol, read once, in the core (standard library only).

* :mod:`prereg.protocol.read`: a protocol file's bytes read as the YAML subset
  (:mod:`prereg.yamlsub`) into a :class:`~prereg.protocol.schema.Document`, every key with its line;
  every refusal an :class:`~prereg.errors.InputError` naming the file, the key and the line.
* :mod:`prereg.protocol.schema`: the document, the field checks (:class:`~prereg.protocol.schema.Field`,
  :func:`~prereg.protocol.schema.mapping`) and the protocol's keys (a command arm's, its metric's
  and a local corpus's too), each declared once with its type, default and origin.
* :mod:`prereg.protocol.model`: the typed protocol (:class:`~prereg.protocol.model.Protocol`,
  its studies and hypotheses) that the plan and the protocol summary are derived from.

The harness (``harness/protocol.py``) reads a protocol with this package, then resolves on top
what needs the file system or torch (configurations, a corpus's files, plug-ins, a command arm's
working directory, commit and program); the public audit reads the tagged protocol with the same
reader.
"""
