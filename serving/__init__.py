"""Serving: merge the batch and speed views and answer queries over HTTP, the CLI and the dashboard.

A query goes one way through one module per job (:func:`serving.answer.answer` drives it; :mod:`serving.window`
loads a window for it):

* planning — :mod:`serving.plan` (the merge rule: which layer serves which minute, and the ``Coverage`` it plans with);
* reading — :mod:`serving.reader` (the layers' state and the rows), :mod:`serving.read_schedule` (the reads of one
  request, in time order), :mod:`serving.lru` (the row caches), :mod:`serving.budget` (what a request may read),
  :mod:`serving.served_row` (a row as a query sees it);
* merging — :mod:`serving.merge` (the one per-row merge), :mod:`serving.answer` (every question's one path: the
  layers' state, the plan, the cache or the reads, the merge), :mod:`serving.answer_cache` (merged answers kept by
  question, and reading and merging only what moved);
* answering — :mod:`serving.queries` (counts, users, quantiles, top, trending, series), :mod:`serving.status` (gap
  minutes, losses, a pin's effect), :mod:`serving.console` (the operator console;
  :mod:`serving.console_sources` reads Airflow and the dead letters for it; :mod:`serving.console_model` is its
  answer's types).

Around them: :mod:`serving.params` (what a query may ask, shared by the CLI and the API), :mod:`serving.cli`
(``trends query``, ``trends serve``), and the HTTP API — :mod:`serving.api` (the app), :mod:`serving.routes`,
:mod:`serving.errors`, :mod:`serving.backend` (the Cassandra session), :mod:`serving.metrics`, :mod:`serving.openapi`;
:mod:`serving.provenance` (what an answer says of itself: spans, gaps, the layers' state).
"""
