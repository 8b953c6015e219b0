"""Personal data's contracts, importable by every layer: where user ids go and how a subject is erased.

``subjects`` (the subject store: a random pseudonym per user under a keyed hash of the id, the hours that hold a
subject's events, unlinking a subject), whose pseudonym rows ``pseudonym_rows`` reads and creates, a bucket of users
per Paxos round, whose hour rows ``hour_rows`` writes a bucket and month at a time, and which trusts what it has
seen for a bounded time (``recent``). ``ledger`` (the append-only, hash-chained record of erasure requests, the
pseudonyms whose events the layers exclude, and the readers the batch exporter, the API and the console use).
Raw user ids never pass ingestion; logs, metrics and messages carry at most the keyed hash that
:meth:`subjects.SubjectStore.subject_hash` gives. ``exclusions`` (the erased subjects' pseudonyms, as the speed and
batch layers read them at every start and run).
"""
