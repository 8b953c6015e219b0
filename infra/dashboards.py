"""Grafana dashboards of the pipeline, as code: one per layer, every panel linked to the docs section on its series.

The panels are declared here (metric, legend, unit, docs page and anchor) and rendered into Grafana's dashboard
JSON, one file per dashboard in ``infra/grafana/`` — the files the package ships and an operator imports.
Generated rather than kept by hand: four dashboards of Grafana JSON repeat the same data source, layout, link and
threshold blocks on every panel, which a hand edit lets drift; here each panel is a few lines and the shape is
written once.
``python -m infra.dashboards`` rewrites the files, ``--check`` fails when they differ from this module (a unit test
runs the same comparison).

The queries use only the metrics the pipeline's processes export (``speed_layer.metrics``,
``batch_layer.exporter``, ``ingestion.metrics``, ``serving.metrics``), never the shipped recording rules, so the
dashboards work on a Prometheus that does not load ``trends.rules.yml``. Variables: ``datasource`` (a Prometheus
data source), ``docs`` (the base URL of the docs site, which the panels' links start from), and per dashboard a
label filter (the speed query, the ingest source) whose "All" is ``.*``. Rates use Grafana's
``$__rate_interval``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from infra.dashboard_model import RATE, Dashboard, Filter, Panel, Row, Target, render

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
SPEED_SEL = 'query=~"$query"'
SOURCE_SEL = 'source=~"$source"'


def _q(metric: str) -> str:
    """Return a selector of one speed metric, filtered by the dashboard's ``query`` variable."""
    return f"{metric}{{{SPEED_SEL}}}"


def _speed_rate(metric: str) -> str:
    return f"sum by (query) (rate({_q(metric)}[{RATE}]))"


SPEED = Dashboard(
    uid="trends-speed",
    title="trends / speed layer",
    description="The Spark Structured Streaming job: freshness, micro-batches, rows it did not aggregate, restarts "
    "and its state (label query: one streaming query, e.g. blue and green during a view-definition change).",
    filters=(Filter("query", "Streaming query", "trends_speed_batches_total"),),
    rows=(
        Row(
            "Freshness",
            (
                Panel(
                    "Freshness (age of the newest event written)",
                    "Wall clock minus the newest event time the job wrote to the speed view: how old the newest "
                    "minute of an answer is. Seconds normally; the alert fires past 15 min while records wait.",
                    (
                        Target(
                            f"time() - max by (query) ({_q('trends_speed_newest_event_timestamp_seconds')})",
                            "{{query}}",
                        ),
                    ),
                    "trendsspeednotfresh",
                    unit="s",
                    red_from=900,
                ),
                Panel(
                    "Consumer lag (records left unread by the last batch)",
                    "Spark's maxOffsetsBehindLatest: above 0 only while max_offsets_per_trigger caps a catch-up.",
                    (Target(f"max by (query) ({_q('trends_speed_consumer_lag_records')})", "{{query}}"),),
                    "trendsspeednotfresh",
                ),
                Panel(
                    "Time since the last progress report",
                    "Spark reports after every micro-batch and every 10 s while idle; minutes of silence are a hung "
                    "micro-batch.",
                    (
                        Target(
                            f"time() - max by (query) ({_q('trends_speed_last_progress_timestamp_seconds')})",
                            "{{query}}",
                        ),
                    ),
                    "trendsspeedstalled",
                    unit="s",
                    red_from=300,
                ),
                Panel(
                    "Watermark delay",
                    "Wall clock minus the streaming watermark (event time): events older than the watermark are "
                    "dropped as late (speed.allowed_lateness_s behind the newest event).",
                    (
                        Target(
                            f"time() - max by (query) ({_q('trends_speed_watermark_timestamp_seconds')})", "{{query}}"
                        ),
                    ),
                    "speed-layer",
                    page="metrics",
                    unit="s",
                ),
            ),
        ),
        Row(
            "Micro-batches",
            (
                Panel(
                    "Micro-batch duration",
                    "Duration of the last micro-batch; the trigger is speed.trigger_seconds (2 s by default).",
                    (Target(f"max by (query) ({_q('trends_speed_batch_duration_seconds')})", "{{query}}"),),
                    "trendsspeedstalled",
                    unit="s",
                ),
                Panel(
                    "Micro-batches per second",
                    "Completed micro-batches.",
                    (Target(_speed_rate("trends_speed_batches_total"), "{{query}}"),),
                    "trendsspeedstalled",
                    unit="ops",
                ),
                Panel(
                    "Rows read and processing rate",
                    "Kafka records read per second, against the rate the last micro-batch processed at: a job "
                    "falling behind reads less than producers write.",
                    (
                        Target(_speed_rate("trends_speed_input_rows_total"), "{{query}} read"),
                        Target(
                            f"max by (query) ({_q('trends_speed_processed_rows_per_second')})",
                            "{{query}} processed (last batch)",
                        ),
                    ),
                    "trendsspeednotfresh",
                    unit="ops",
                ),
                Panel(
                    "Rows not aggregated, per second",
                    "Events dropped as later than the watermark, records that are not events, events beyond the "
                    "future skew, and events below the batch boundary a checkpoint started from.",
                    (
                        Target(_speed_rate("trends_speed_dropped_late_rows_total"), "{{query}} dropped late"),
                        Target(_speed_rate("trends_speed_unparseable_rows_total"), "{{query}} unparseable"),
                        Target(_speed_rate("trends_speed_future_rows_total"), "{{query}} future"),
                        Target(
                            _speed_rate("trends_speed_skipped_below_batch_watermark_rows_total"),
                            "{{query}} below the batch watermark",
                        ),
                    ),
                    "speed-layer",
                    page="metrics",
                    unit="ops",
                ),
            ),
        ),
        Row(
            "Restarts and state",
            (
                Panel(
                    "Restarts in the last hour",
                    "Restarts of the job by the stack's supervisor after a failure; three in an hour alert.",
                    (Target(f"max by (query) (increase({_q('trends_speed_restarts_total')}[1h]))", "{{query}}"),),
                    "trendsspeedrestarting",
                    red_from=3,
                ),
                Panel(
                    "State memory",
                    "Spark's memoryUsedBytes of the stateful operators (RocksDB: memtables, block cache, table "
                    "readers; native memory outside the JVM heap).",
                    (Target(f"max by (query) ({_q('trends_speed_state_memory_bytes')})", "{{query}}"),),
                    "speed-layer",
                    page="metrics",
                    unit="bytes",
                ),
                Panel(
                    "State rows",
                    "Rows in the streaming state (buckets within the watermark, ids kept for dedupe). Exported only "
                    "with speed.track_state_rows=true (counting costs the state speed): empty otherwise.",
                    (Target(f"max by (query) ({_q('trends_speed_state_rows')})", "{{query}}"),),
                    "speed-layer",
                    page="metrics",
                ),
            ),
        ),
    ),
)

BATCH = Dashboard(
    uid="trends-batch",
    title="trends / batch layer",
    description="The batch layer's state as `trends batch exporter` reads it from Cassandra on each scrape (the "
    "watermark, the index, hours that need work) and its DAG runs as Airflow's REST API reports them.",
    rows=(
        Row(
            "Watermark",
            (
                Panel(
                    "Watermark lag behind the newest closed hour",
                    "End of the newest closed hour minus the batch watermark: 0 to about 1 h normally; 3 h is two "
                    "hourly runs missed (warning), 48 h no longer heals by itself (critical).",
                    (Target("trends_batch_watermark_lag_seconds", "watermark lag"),),
                    "trendsbatchwatermarklag",
                    unit="s",
                    red_from=3 * 3600,
                ),
                Panel(
                    "Index horizon lag, by the partition holding it",
                    "Wall clock minus the event time every active partition has passed; `partition` holds it back "
                    "(none: every partition idle). A partition fed old timestamps keeps every hour open.",
                    (Target("max by (partition) (trends_batch_index_horizon_lag_seconds)", "held by {{partition}}"),),
                    "trendsbatchhorizonheldback",
                    unit="s",
                    red_from=3 * 3600,
                ),
                Panel(
                    "Exporter reads Cassandra",
                    "1 when the last scrape read the batch layer's state within the timeout; at 0 every batch panel "
                    "and alert is blind.",
                    (Target("min(trends_batch_up)", "batch state read"),),
                    "trendsbatchexporterfailing",
                    stat=True,
                ),
            ),
        ),
        Row(
            "Hours that need work",
            (
                Panel(
                    "Stale hours",
                    "Completed hours whose indexed records grew after their current run read them (late data); "
                    "each hourly run recomputes them.",
                    (Target("trends_batch_stale_hours", "stale"),),
                    "trendsbatchstalehours",
                    red_from=1,
                ),
                Panel(
                    "Missing hours",
                    "Hours below the watermark without a current run: served as gaps.",
                    (Target("trends_batch_missing_hours", "missing"),),
                    "trendsbatchmissinghours",
                    red_from=1,
                ),
                Panel(
                    "Incomplete hours",
                    "Hours that may hold records removed from Kafka before they were indexed.",
                    (Target("trends_batch_incomplete_hours", "incomplete"),),
                    "trendsbatchincompletehours",
                    red_from=1,
                ),
                Panel(
                    "Old-definition hours",
                    "Hours below the watermark computed with another view definition than the serving one; a "
                    "backfill recomputes them.",
                    (Target("trends_batch_old_definition_hours", "old definition"),),
                    "trendsbatcholddefinitionhours",
                    red_from=1,
                ),
                Panel(
                    "Pending hours",
                    "Closed hours above the watermark without a current run: the next runs' work.",
                    (Target("trends_batch_pending_hours", "pending"),),
                    "trendsbatchwatermarklag",
                ),
            ),
        ),
        Row(
            "Erasure requests",
            (
                Panel(
                    "Oldest pending erasure request",
                    "How long the oldest erasure (forget) request not done yet has waited: it waits for its unlink "
                    "or for the recompute of its hours. Past privacy.erasure_deadline_days (the red line is the "
                    "default, 30 days) the request is overdue.",
                    (Target("max(trends_privacy_erasure_oldest_pending_age_seconds)", "oldest pending"),),
                    "trendserasureoverdue",
                    unit="s",
                    red_from=30 * 86400,
                ),
                Panel(
                    "Erasure requests by state",
                    "Requests in the erasure ledger: pending, done, failed (trends privacy status lists them).",
                    (Target("max by (state) (trends_privacy_erasure_requests)", "{{state}}"),),
                    "erasure",
                    page="metrics",
                ),
            ),
        ),
        Row(
            "Runs (Airflow)",
            (
                Panel(
                    "Time since the DAG's last successful run",
                    "Per DAG; the hourly trends_batch should succeed every hour (a DAG that never succeeded has no "
                    "series).",
                    (
                        Target(
                            "time() - max by (dag_id) (trends_airflow_dag_last_success_timestamp_seconds)",
                            "{{dag_id}}",
                        ),
                    ),
                    "trendsbatchdagnotsucceeding",
                    unit="s",
                ),
                Panel(
                    "Failed task instances",
                    "Task instances that failed after their retries within metrics.airflow_failed_window_s.",
                    (Target("max by (dag_id) (trends_airflow_failed_task_instances)", "{{dag_id}}"),),
                    "trendsairflowtaskfailed",
                    red_from=1,
                ),
                Panel(
                    "Exporter reads Airflow",
                    "1 when the last scrape read Airflow's REST API within the timeout.",
                    (Target("min(trends_airflow_up)", "Airflow read"),),
                    "trendsairflowunreachable",
                    stat=True,
                ),
            ),
        ),
    ),
)


def _ingest_rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{SOURCE_SEL}}}[{RATE}]))"


INGEST = Dashboard(
    uid="trends-ingest",
    title="trends / ingestion",
    description="Long-running `trends ingest` processes (metrics.ingest_port set): events delivered, records "
    "dead-lettered by reason, delivery failures (label source: the command).",
    filters=(Filter("source", "Ingest command", "trends_ingest_events_sent_total"),),
    rows=(
        Row(
            "Records",
            (
                Panel(
                    "Events delivered per second",
                    "Events the broker acknowledged on the events topic (acks=all).",
                    (Target(_ingest_rate("trends_ingest_events_sent_total", "source"), "{{source}}"),),
                    "ingestion",
                    page="metrics",
                    unit="ops",
                ),
                Panel(
                    "Dead letters per second, by reason",
                    "Records handed to the dead-letter topic with their reason (every reason is exported from 0). "
                    "`trends ingest dlq` shows samples.",
                    (Target(_ingest_rate("trends_ingest_dead_letters_total", "reason"), "{{reason}}"),),
                    "trendsdeadletterrate",
                    unit="ops",
                ),
                Panel(
                    "Dead-letter ratio",
                    "Dead letters over all records; the alert fires above 1 % over 10 min.",
                    (
                        Target(
                            f"sum(rate(trends_ingest_dead_letters_total{{{SOURCE_SEL}}}[{RATE}])) / "
                            f"(sum(rate(trends_ingest_events_sent_total{{{SOURCE_SEL}}}[{RATE}])) + "
                            f"sum(rate(trends_ingest_dead_letters_total{{{SOURCE_SEL}}}[{RATE}])))",
                            "dead letters / records",
                        ),
                    ),
                    "trendsdeadletterrate",
                    unit="percentunit",
                    red_from=0.01,
                ),
                Panel(
                    "Delivery failures per second, by topic",
                    "Records whose delivery failed, to the events topic or to the dead-letter topic.",
                    (Target(_ingest_rate("trends_ingest_delivery_failures_total", "topic"), "{{topic}}"),),
                    "ingestion",
                    page="metrics",
                    unit="ops",
                ),
            ),
        ),
    ),
)

LATENCY = "sum by (le) (rate(trends_api_request_seconds_bucket[$__rate_interval]))"

API = Dashboard(
    uid="trends-api",
    title="trends / API",
    description="`trends serve`: requests, errors and latency by route, Cassandra reachability, the row and answer "
    "caches, and the minutes of the last 24 h that answers report as gaps.",
    rows=(
        Row(
            "Requests",
            (
                Panel(
                    "Requests per second, by route",
                    "HTTP requests answered, every status.",
                    (Target(f"sum by (route) (rate(trends_api_requests_total[{RATE}]))", "{{route}}"),),
                    "api",
                    page="metrics",
                    unit="reqps",
                ),
                Panel(
                    "Errors per second, by status and route",
                    "Answers with a 4xx (refused requests) or 5xx status.",
                    (
                        Target(
                            f'sum by (status, route) (rate(trends_api_requests_total{{status=~"[45].."}}[{RATE}]))',
                            "{{status}} {{route}}",
                        ),
                    ),
                    "api",
                    page="metrics",
                    unit="reqps",
                ),
                Panel(
                    "Latency (all routes)",
                    "Quantiles of the request latency histogram.",
                    (
                        Target(f"histogram_quantile(0.5, {LATENCY})", "p50"),
                        Target(f"histogram_quantile(0.95, {LATENCY})", "p95"),
                        Target(f"histogram_quantile(0.99, {LATENCY})", "p99"),
                    ),
                    "api",
                    page="metrics",
                    unit="s",
                ),
                Panel(
                    "Latency p95, by route",
                    "The 95th percentile per route (a route without requests in the interval has no value).",
                    (
                        Target(
                            f"histogram_quantile(0.95, sum by (le, route) "
                            f"(rate(trends_api_request_seconds_bucket[{RATE}])))",
                            "{{route}}",
                        ),
                    ),
                    "api",
                    page="metrics",
                    unit="s",
                ),
            ),
        ),
        Row(
            "Caches",
            (
                Panel(
                    "Row cache reads per second",
                    "View-row reads answered from the cache (hits) and sent to Cassandra (misses); misses after a "
                    "backfill are expected (new runs are new keys).",
                    (
                        Target(f"sum(rate(trends_api_row_cache_hits_total[{RATE}]))", "hits"),
                        Target(f"sum(rate(trends_api_row_cache_misses_total[{RATE}]))", "misses"),
                    ),
                    "api",
                    page="metrics",
                    unit="ops",
                ),
                Panel(
                    "Answers per second, by cache outcome",
                    "hit: a lookup; partial: the batch part kept, changed speed minutes read again; miss.",
                    (Target(f"sum by (outcome) (rate(trends_api_answers_total[{RATE}]))", "{{outcome}}"),),
                    "api",
                    page="metrics",
                    unit="ops",
                ),
                Panel(
                    "Cache memory",
                    "Bytes the row caches and the answer cache hold (serving.cache_mb, serving.answer_cache_mb).",
                    (
                        Target("sum(trends_api_row_cache_bytes)", "rows"),
                        Target("sum(trends_api_answer_cache_bytes)", "answers"),
                    ),
                    "api",
                    page="metrics",
                    unit="bytes",
                ),
            ),
        ),
        Row(
            "What users see",
            (
                Panel(
                    "Gap minutes of the last 24 h, by reason",
                    "Minutes a figure over the last 24 h leaves out, by reason; the current minute is always "
                    "'not yet seen by the speed layer'.",
                    (Target("max by (reason) (trends_api_gap_minutes)", "{{reason}}"),),
                    "trendsanswershavegaps",
                ),
                Panel(
                    "API reads Cassandra",
                    "1 if the API's last Cassandra read succeeded; /ready answers 503 while it cannot.",
                    (Target("min(trends_api_cassandra_up)", "Cassandra up"),),
                    "api",
                    page="metrics",
                    stat=True,
                ),
            ),
        ),
    ),
)

DASHBOARDS = (SPEED, BATCH, INGEST, API)


def files() -> dict[str, str]:
    """Return each dashboard's file name and JSON text, as committed in ``infra/grafana/``."""
    return {f"{d.uid}.json": json.dumps(render(d), indent=2, ensure_ascii=False) + "\n" for d in DASHBOARDS}


def main(argv: list[str] | None = None) -> int:
    """Write the dashboards into ``infra/grafana/`` (``--check``: only compare, exit 1 on a difference)."""
    parser = argparse.ArgumentParser(prog="python -m infra.dashboards", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="compare the committed files, write nothing")
    args = parser.parse_args(argv)
    wanted = files()
    stale = sorted(
        n for n, text in wanted.items() if not (GRAFANA_DIR / n).is_file() or (GRAFANA_DIR / n).read_text() != text
    )
    extra = sorted(p.name for p in GRAFANA_DIR.glob("*.json") if p.name not in wanted)
    if args.check:
        for name in [*stale, *extra]:
            print(f"{GRAFANA_DIR / name} differs from infra/dashboards.py: run python -m infra.dashboards")
        return int(bool(stale or extra))
    GRAFANA_DIR.mkdir(exist_ok=True)
    for name in stale:
        (GRAFANA_DIR / name).write_text(wanted[name])
    for name in extra:
        (GRAFANA_DIR / name).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
