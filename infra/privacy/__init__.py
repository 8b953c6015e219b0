"""Personal data: the subject store that links users to pseudonyms, the erasure ledger, and the erased subjects.

Contracts every layer imports: ingestion pseudonymises through the subject store, the speed and batch layers leave
out the events of erased subjects, and ``privacy/`` (the ``trends privacy`` commands) records requests in the ledger.

``exclusions`` (the erased subjects' pseudonyms both layers leave out).
"""
