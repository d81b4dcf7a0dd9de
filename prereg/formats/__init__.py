"""The formats of the core: a run's record (``record``), the derived summary (``summary``), the
ledger and its hashes (``ledger``) and the field checks at the JSON boundary (``jsonfields``). The
rest of the core computes on the typed objects these modules read and write."""
