"""The views' storage contract: the tables, every statement on them, the row types, and their readers and writers.

``cql`` holds the statements, ``rows`` the row types, ``batch`` the batch view's rows, ``pointers`` its pointer,
watermark and staleness tables, ``speed`` the speed view and its freshness. The layers keep their logic (the batch
run sequence, the streaming sink, the serving read plan and cache) and store through these, never raw CQL.
"""
