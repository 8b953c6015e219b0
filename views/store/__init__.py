"""The views' storage contract: the tables, every statement on them, the row types, and their readers and writers.

``cql`` (the statements), ``rows`` (the row types), ``batch`` (the batch view's rows), ``pointers`` (the batch
view's pointers, watermark and stale hours), ``speed`` (the speed view, its freshness and epochs), ``rollups`` (the
speed view's closed intervals merged), ``definitions``
(the view versions in use), ``index`` (the event-time index's spans and totals), ``losses`` (records lost before
indexing), ``checks`` (the last reconciliation of each hour). The layers keep their logic and store through these,
never raw CQL.
"""
