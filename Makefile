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

.PHONY: pipeline bench-spark test-spark-full bench-ack-state setup proto run test test-unit test-integration test-archive-full bench bench-bookie \
	bench-pulsar bench-subscriptions bench-archive bench-gateway fuzz-gateway clean

setup: $(STAMP) proto

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
		echo "Magnetar needs Python 3.11; $(PYTHON) is $$($(PYTHON) --version 2>&1)." \
		     "Install python3.11 or run: make PYTHON=/path/to/python3.11 ..." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev]'
	touch $(STAMP)

proto: $(STAMP) $(PROTO_OUT)

%_pb2.py: %.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $<

run: setup
	$(VENV)/bin/magnetar standalone --data-dir $(DATA_DIR)

# The package layers first (.importlinter; a second of work), then every test.
test: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests

test-unit: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests/unit

test-integration: setup
	$(PY) -m pytest -q tests/integration

# The archive's end-to-end test at the issue's full size: 100,000 messages produced,
# archived, bookie copies deleted, consumed from the archive (`make test` runs 10,000).
test-archive-full: setup
	ARCHIVE_TEST_MESSAGES=100000 $(PY) -m pytest -q tests/integration/test_archive.py

# The Spark data source's tests at the issue's full size: 100,000 messages produced,
# archived and read back through Spark (`make test` runs 10,000).
test-spark-full: setup
	SPARK_TEST_MESSAGES=100000 $(PY) -m pytest -q tests/integration/test_spark.py

# A pipeline you can run (about 3-5 minutes, README "Spark"): a cluster, click events
# produced and archived, a Spark batch aggregation and a streaming query writing to a topic.
pipeline: setup
	$(PY) examples/spark_pipeline.py --events 20000

# The Spark data source (about 3-5 minutes): the archive scanned through Spark in rows/s
# against a plain Parquet file of the same rows written in the same run.
bench-spark: setup
	$(PY) bench/spark_bench.py --out bench/results/spark.json

bench: bench-bookie bench-pulsar bench-subscriptions bench-archive bench-gateway

# Acknowledgement state at scale (seconds): a cursor filling 100,000 holes, as a ratio
# to a plain set in the same run (speed is measured here, not in the unit tests).
bench-ack-state: setup
	$(PY) bench/ack_state_bench.py --out bench/results/ack_state.json

bench-bookie: setup
	$(PY) bench/bookie_bench.py --out bench/results/bookie.json

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

# The HTTP gateway (about 6 minutes): batched produce, pull + ack and single-produce
# latency against the official client in the same run (bench/results/gateway.json), then
# locust headless, 50 users for 60 s, produce + pull + ack (bench/results/gateway_locust.json).
bench-gateway: setup
	$(PY) bench/gateway_bench.py --out bench/results/gateway.json
	$(PY) bench/gateway_load.py --out bench/results/gateway_locust.json

# Property-based requests from the gateway's OpenAPI document, over 1,000 cases (a few
# minutes; make test runs the same with fewer): bench/results/gateway_fuzz.json.
fuzz-gateway: setup
	GATEWAY_FUZZ_EXAMPLES=45 GATEWAY_FUZZ_REPORT=bench/results/gateway_fuzz.json \
		$(PY) -m pytest -q tests/integration/test_gateway_bad_input.py -k generated

clean:
	rm -rf $(VENV) build *.egg-info
	find . -name '*_pb2*.py*' -not -path './$(VENV)/*' -delete
