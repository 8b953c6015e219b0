# Two commands on a fresh machine: `make demo` and `make test`. Everything else is reached from them.
SHELL := /bin/bash
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
JARS := $(VENV)/.jars
BROWSER := $(VENV)/.browser
PROMTOOL := $(VENV)/.promtool
GOTOOLS := $(VENV)/.gotools

.PHONY: bench-peers help setup demo wheel test test-unit test-services test-faults test-reliability test-cluster test-alerting test-privacy test-backfill test-install test-network test-soak test-capacity test-sources gotools lint docs-check docs format lock stack-down clean

help:
	@echo "make demo        set up, start the stack and run the whole pipeline (stream, Airflow backfill, API, dashboard)"
	@echo "make test        set up, lint (ruff, mypy) and run the whole test suite against the real services"
	@echo "make test-unit   fast tests only (no services)"
	@echo "make test-faults       speed rows expiring, checkpoints lost (also under the running job), records lost before indexing, a far-future record, history behind live events, the speed layer's late events and duplicates, the console (not part of make test)"
	@echo "make test-reliability  the fault-injection suite (not part of make test)"
	@echo "make test-cluster      Spark standalone cluster, 3-broker Kafka, 2-node Cassandra (not part of make test)"
	@echo "make test-backfill     trends batch backfill over 30 days, with Cassandra stopped, the DAG under Airflow's scheduler, Airflow's backfill and reprocess (not part of make test)"
	@echo "make wheel       build the wheel and sdist that deploy every role into dist/, constraints.txt beside them"
	@echo "make test-install      the built wheel in a fresh venv, no checkout: admin init, ingest, speed, Airflow's recompute, serve; and pip install . without extras"
	@echo "make test-tls          the pipeline over TLS and SASL_SSL on a private TLS stack (not part of make test)"
	@echo "make test-network      network faults (latency, black hole, reset, bandwidth, slicer) through Toxiproxy between the components (not part of make test)"
	@echo "make test-sources      the HTTP collector (trends collect) and the Kafka bridge (Avro in two schema versions, Protobuf, JSON, a real schema registry) and the events topic in Avro against the real Kafka: dead letters, retries counted once, Kafka unreachable, SIGKILLs, a registry outage, Schemathesis (not part of make test)"
	@echo "make test-capacity     the soak's stack at rising rates until one is not sustained: the whole stack's capacity (not part of make test)"
	@echo "make test-soak         the whole stack for SOAK_MINUTES (default 60) at a steady rate, a fault every 10 min, resources bounded (not part of make test)"
	@echo "make test-alerting     the alert rules (promtool), a real Prometheus firing the watermark-lag alert, the dashboards' panels with data (not part of make test)"
	@echo "make test-privacy      pseudonymous user ids (no raw id in Kafka) and erasure: forget, export, the ledger and its verification (not part of make test)"
	@echo "make bench-peers   the speed layer beside Flink and quixstreams on the same events, each checked exact first (.venv-peers; ~35 min)"
	@echo "make gotools     build promtool, prometheus and toxiproxy from Go modules into ~/.cache/trends/bin (once, ~6 min)"
	@echo "make lint        ruff check, ruff format --check, mypy, lint-imports (the layering contracts)"
	@echo "make docs-check  build the docs site with mkdocs --strict (broken links, missing pages, issue citations, pages over 4,000 words fail; part of make test)"
	@echo "make docs        serve the docs site on http://127.0.0.1:8001 (live reload; DOCS_ADDR=host:port to move it)"
	@echo "make lock        re-resolve the dependencies and rewrite constraints.txt"
	@echo "make stack-down  stop the local servers"

# The venv, with exactly the pinned versions of constraints.txt.
$(INSTALLED): pyproject.toml constraints.txt
	@$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "Python 3.11 is needed (set PY=...)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# pip installs only uv (pinned); uv installs the rest of the pins: 26-35 s on a fresh clone where pip took 81 s.
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(BIN)/uv pip install --quiet --system-certs --python $(BIN)/python -c constraints.txt -e '.[dev]'
	touch $@

# Kafka, Cassandra and the Spark Kafka connector, fetched with Maven into ~/.cache/trends (outside git).
$(JARS): $(INSTALLED) $(wildcard infra/maven/*/pom.xml)
	$(BIN)/trends stack fetch
	touch $@

# promtool, for the alert rules' and the dashboards' checks in make test, built with `go install` into
# ~/.cache/trends/bin (outside git). The Prometheus server and Toxiproxy are built only for the suites that run them
# (test-alerting, test-network): a first make test compiles promtool alone. Rebuilt only when a binary is missing.
$(PROMTOOL): $(INSTALLED) stack/gotools.py
	$(BIN)/python -m stack.gotools promtool
	touch $@

$(GOTOOLS): $(INSTALLED) stack/gotools.py
	$(BIN)/python -m stack.gotools
	touch $@

gotools: $(GOTOOLS)

# Debian's headless Chromium and its driver, for the dashboard test (Selenium drives them).
$(BROWSER):
	@if ! { command -v chromium && command -v chromedriver; } >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  echo "installing chromium and chromium-driver (Debian packages) for the dashboard test"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	fi
	@mkdir -p $(VENV) && touch $@

setup: $(INSTALLED) $(JARS)

demo: setup
	$(BIN)/trends demo

# The one artifact every role installs (docs/deploy.md), with the pins it was tested with beside it.
wheel: $(INSTALLED)
	$(BIN)/python -m build --outdir dist .
	cp constraints.txt dist/

test: setup $(BROWSER) $(PROMTOOL) lint docs-check
	$(BIN)/pytest --durations=25

test-unit: $(INSTALLED) $(PROMTOOL)
	$(BIN)/pytest -m "not services and not spark and not soak"

# The slow suites of faults as they happen (marked `faults`; kept out of make test to hold it under 25 minutes):
# speed rows lost and expired by TTL and a lost checkpoint (test_speed_coverage), a new checkpoint from the batch
# watermark (test_speed_from_watermark), the checkpoint deleted under the running speed service
# (test_speed_lost_checkpoint), records removed before indexing (test_batch_loss), a far-future record
# (test_event_time_guard), the operator console over them in Chromium, Schemathesis with Cassandra unreachable,
# a failing speed service restarted with backoff (test_speed_restart), a broker restart under the producer
# (test_ingestion_kafka), the event-time indexer killed mid-run and history replayed behind live events
# (test_batch_history), and late events and duplicates in the speed layer (test_speed_layer).
test-faults: setup $(BROWSER)
	$(BIN)/pytest -m faults tests/services/test_speed_coverage.py tests/services/test_speed_from_watermark.py tests/services/test_speed_lost_checkpoint.py tests/services/test_batch_loss.py tests/services/test_event_time_guard.py tests/services/test_console.py tests/services/test_view_versions.py tests/services/test_serving_api.py \
		tests/services/test_speed_restart.py tests/services/test_ingestion_kafka.py tests/services/test_batch_history.py \
		tests/services/test_speed_layer.py

# Faults against the whole pipeline (broker restart, Cassandra down, SIGKILLs, duplicates, late events, bad input);
# prints the table of cases and writes artifacts/reliability.md.
test-reliability: setup
	$(BIN)/pytest -m reliability tests/reliability

# The jobs on a Spark standalone cluster (master + 2 workers from pyspark's spark-class) against local mode.
test-cluster: setup
	$(BIN)/pytest -m cluster tests/cluster

# `trends batch backfill --wait` over 30 days (exact) and with Cassandra stopped mid-run, on a private Cassandra and
# Airflow, the hourly DAG's runs over empty, missing and stale hours, and Airflow's own backfill (CLI and REST) and
# reprocess of completed hours on the stack's Airflow (6-10 min; kept out of make test, which
# would pass 25 minutes with it).
test-backfill: setup
	$(BIN)/pytest -m backfill tests/services/test_batch_backfill_cli.py tests/services/test_batch_dag.py tests/services/test_airflow_stack.py

# The install without extras (`pip install .`, the pinned versions, no Airflow) in its own venv, non-editable:
# `trends ingest`, the speed job, `trends batch index|run` and `trends serve` against the local stack, and
# `import airflow` failing there (~3 min with a warm pip cache; not part of make test).
CORE_VENV ?= .venv-core
$(CORE_VENV)/.installed: pyproject.toml constraints.txt $(shell find app infra ingestion speed_layer batch_layer views serving privacy -name '*.py' -o -name '*.cql' 2>/dev/null)
	rm -rf $(CORE_VENV) && $(PY) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt .
	rm -rf build  # setuptools' build folder of the non-editable install
	touch $@

# And `pip install '.[airflow]'` in .venv-airflow, where the DAG files must parse.
AIRFLOW_VENV ?= .venv-airflow
$(AIRFLOW_VENV)/.installed: pyproject.toml constraints.txt
	rm -rf $(AIRFLOW_VENV) && $(PY) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt '.[airflow]'
	rm -rf build
	touch $@

test-install: setup $(CORE_VENV)/.installed $(AIRFLOW_VENV)/.installed
	TRENDS_TEST_CORE_VENV=$(CORE_VENV) TRENDS_TEST_AIRFLOW_VENV=$(AIRFLOW_VENV) $(BIN)/pytest -m install tests/services/test_install.py tests/services/test_wheel.py tests/services/test_speed_checkpoint.py tests/services/test_index_rebuild.py

# The whole pipeline over TLS (Kafka SASL_SSL with SCRAM-SHA-512, Cassandra client encryption and a password) on a
# private TLS stack (ports 19110-19122), compared with the same run on the plaintext stack (4-8 min here).
.PHONY: test-tls
test-tls: setup
	$(BIN)/pytest -m tls tests/services/test_tls_pipeline.py

# The shipped alert rules and dashboards: promtool's check and unit tests, then a real Prometheus scraping the batch
# exporter (alerts firing), and one scraping a short run of the whole pipeline (every dashboard panel has data).
test-alerting: setup $(GOTOOLS)
	$(BIN)/pytest tests/unit/test_alert_rules.py tests/unit/test_dashboards.py
	$(BIN)/pytest -m alerting tests/services/test_alerting.py tests/services/test_dashboards.py

# Pseudonymous user ids from the first hop (marked `privacy`): the subject store against the real Cassandra, and the
# generator and file replay (two producers racing on the same users) into private topics, then the topic and its
# segment files read for raw ids; forget, export through the offset index, the erasure ledger (racing writers, an
# edited row found by --verify) and the API's forget route.
test-privacy: setup
	$(BIN)/pytest -m privacy tests/services/test_privacy_*.py

# Network faults between the components: a Toxiproxy server (built into the cache with the Go tools) in front of
# Cassandra, a private Kafka broker and Airflow; each client pointed at its proxy by settings only. Writes
# artifacts/network.md (link x fault -> what the component did, recovery time, counts after).
test-network: setup $(GOTOOLS)
	$(BIN)/pytest -m network tests/network

# The event sources against the real Kafka (marked `sources`): the HTTP collector run as `trends collect` -- valid,
# invalid and mixed batches read back from the topics, gzip and the size limit, the same batch twice counted once by
# the speed and batch layers (Spark), Kafka unreachable mid-request through Toxiproxy in front of a private broker (the shared
# one untouched), Schemathesis with every check on its OpenAPI document. The Kafka bridge (`trends ingest kafka`) from
# Avro topics with two schema versions interleaved, Protobuf and JSON, with a real Apicurio Registry (fetched and
# started on demand, Java 21+); three SIGKILLs of the bridge mid-stream, then exact counts; the registry stopped for
# 30 s mid-run (~10 min in all).
test-sources: setup $(GOTOOLS)
	$(BIN)/pytest -m sources tests/services/test_collector.py tests/services/test_bridge.py tests/services/test_events_avro.py

# The peers bench (bench/peers/): Flink and quixstreams in their own venv (never the pipeline's dependencies), their
# jars fetched with Maven from bench/peers/pom.xml into the jar cache, then the bench against the local stack.
# BENCH_ARGS passes options on (e.g. BENCH_ARGS="--events 200000 --systems speed,quix").
PEERS_VENV ?= .venv-peers
$(PEERS_VENV)/.installed: bench/peers/requirements.txt bench/peers/constraints.txt
	rm -rf $(PEERS_VENV) && $(PY) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --disable-pip-version-check -c bench/peers/constraints.txt -r bench/peers/requirements.txt
	touch $@

bench-peers: setup $(PEERS_VENV)/.installed
	$(BIN)/trends stack up
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/peers/peer_jars.py
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/peers/peers_bench.py $(BENCH_ARGS)

# The soak: a private stack (Kafka, Cassandra, Airflow's scheduler with the hourly DAG, the speed service, the API
# with 2 workers) at a steady rate for SOAK_MINUTES (default 60; SOAK_MINUTES=10 scales the fault interval and the
# warm-up with it), a fault every 10 minutes; resources sampled every 30 s and bounded; writes artifacts/soak.md and
# its plots; first, the API's memory across eight Cassandra outages and four quiet spells (~28 min,
# artifacts/api-outages.md). Under the services lock, so it never overlaps another engineer's service tests on this
# machine.
SOAK_LOCK ?= /tmp/trends-services.lock
test-soak: setup
	flock $(SOAK_LOCK) $(BIN)/pytest -m soak -s tests/soak

# The capacity run: the soak's private stack at rising rates (CAPACITY_RATES, CAPACITY_STEP_MINUTES a step, default
# 10) until a step misses freshness p99 5 s, the producer's rate, a steady lag or the dashboards' answers; every
# closed hour exact through the DAG; writes artifacts/capacity.md (each step's CPU per process: what saturates first).
test-capacity: setup
	flock $(SOAK_LOCK) $(BIN)/pytest -m capacity -s tests/soak/test_capacity.py

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The docs site (mkdocs.yml, docs/): --strict turns a broken link, a page missing from the nav, a failed generated
# reference (the CLI's, from the click commands) and what docs/hooks/manual.py finds (a page citing an issue or a
# work session, a page of the nav over 4,000 words) into an error. Not --quiet: MkDocs 1.6 then drops the warnings
# before --strict counts them, and the build passes. The built site goes to site/ (ignored).
docs-check: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# On 8001: the API and dashboard of `make demo` keep 8000.
DOCS_ADDR ?= 127.0.0.1:8001
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a $(DOCS_ADDR)

format: $(INSTALLED)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Resolve the direct dependencies of pyproject.toml together in a throw-away venv and pin the result. [dev]
# includes [airflow], so one set holds every extra; each install (none, [airflow], [dev]) is then resolved again
# within the pins, so a pin one of them cannot use fails here rather than in a deployment.
lock:
	rm -rf .lock-venv && $(PY) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
	.lock-venv/bin/pip check
	{ echo "# Resolved with 'make lock' from pyproject.toml (every extra); install with pip -c constraints.txt."; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -v '^-e '; } > constraints.txt
	for extras in '' '[airflow]' '[dev]'; do \
	  .lock-venv/bin/pip install --quiet --disable-pip-version-check --dry-run --ignore-installed -c constraints.txt ".$$extras" \
	    || { echo "the pins do not resolve for .$$extras"; exit 1; }; \
	done
	rm -rf .lock-venv

stack-down: $(INSTALLED)
	$(BIN)/trends stack down

clean:
	rm -rf $(VENV) $(CORE_VENV) $(AIRFLOW_VENV) $(PEERS_VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
