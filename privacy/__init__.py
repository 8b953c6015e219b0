"""Users' rights over their data: erasure ("forget"), access ("export") and the erasure ledger's commands.

A layer beside ingestion and serving: it imports ``views`` and ``infra`` only. ``erasure`` (forget, its status, the
recompute's entry point), ``export`` (a subject's events through the offset index), ``cli`` (``trends privacy``),
``api`` (the HTTP routes that ``app/`` mounts into the API). The ledger and the subject store themselves are
contracts in :mod:`infra.privacy`, so the batch exporter and the API read them too.
"""
