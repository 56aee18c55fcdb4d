# Understudy — `make demo` and `make test` work on a fresh machine: both run `make setup`.
.PHONY: setup test test-fast lint demo bench drill-cluster drill-ordered drill-delayed chaos e2e fuzz clean images e2e-containers

VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest

setup:
	@bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict broker_image/src operator/src spark_jobs/src harness/src
	$(VENV)/bin/mypy --strict fuzz e2e_containers
	$(VENV)/bin/lint-imports

# The Spark and harness tests run beside the rest (scripts/test.sh); PYTEST_ARGS selects, in one run.
test: setup lint
	@bash scripts/test.sh $(PYTEST_ARGS)

test-fast: setup
	$(PYTEST) -m "not e2e and not slow and not spark" $(PYTEST_ARGS)

demo: setup
	@bash scripts/demo.sh

bench: setup
	@mkdir -p bench-results
	$(PY) bench/run.py $(BENCH_ARGS)

# The cluster scenario's fault cycles (kill and hang of masters, member joins, leaves and
# crashes), judged by the checker; a soak, not part of `make test` (docs/cluster.md).
drill-cluster: setup
	@mkdir -p bench-results
	$(VENV)/bin/understudy drill --scenario cluster --cycles $${CYCLES:-6} --json bench-results/drill-cluster.json

# The ordered scenario's cycles (the send head's master killed or hung; producer and
# consumer processes paused, the active producer and a reader crashed), judged by the
# checker's order check and the chain rules; a soak, not part of `make test`
# (docs/ordered.md).
drill-ordered: setup
	@mkdir -p bench-results
	$(VENV)/bin/understudy drill --scenario ordered --cycles $${CYCLES:-6} --json bench-results/drill-ordered.json

# Delayed messages and nacks through kill and hang of masters, each slave acting for two
# minutes while messages and retries fall due (escape); docs/delayed.md. A soak.
drill-delayed: setup
	@mkdir -p bench-results
	$(VENV)/bin/understudy drill --scenario delayed --cycles $${CYCLES:-4} --dwell $${DWELL:-120} --json bench-results/drill-delayed.json

# The chaos soak (docs/local-and-drill.md, "Chaos soak"): CYCLES cycles (100) of mixed
# faults (kill -9, hang, ZooKeeper session expiry, each partition, ZooKeeper leader loss,
# disk full) over a topic on two groups with two members per consumer group, a 3-server
# ZooKeeper, the cluster in network namespaces where it may (root); judged by the checker;
# a table per fault kind, bench-results/chaos.json (one object per kind). New cycles stop
# once the run would last longer than CHAOS_MINUTES (30). `make test` runs one cycle of
# each kind (harness/tests/test_chaos.py).
CHAOS_MINUTES ?= 30

chaos: setup
	@mkdir -p bench-results
	$(VENV)/bin/understudy drill --faults mixed --cycles $${CYCLES:-100} --zk-ensemble 3 \
		--max-minutes $(CHAOS_MINUTES) --json bench-results/chaos-drill.json \
		--kinds-json bench-results/chaos.json

# Coverage-guided fuzzing (docs/fuzzing.md): every atheris target for FUZZ_SECONDS, then
# a live broker fed fuzzed frames over TCP as long; corpora, findings and summary.json in
# bench-results/fuzz/. `make test` runs each for a few seconds.
FUZZ_SECONDS ?= 300

fuzz: setup
	@mkdir -p bench-results/fuzz
	@status=0; \
	$(PY) -m fuzz.campaign --seconds $(FUZZ_SECONDS) --out bench-results/fuzz || status=1; \
	UNDERSTUDY_FUZZ_LIVE_SECONDS=$(FUZZ_SECONDS) UNDERSTUDY_FUZZ_LIVE_FRAMES=1000000000 \
		$(PYTEST) tests/test_fuzz.py -k live_broker -s -q --timeout=$$(( $(FUZZ_SECONDS) + 300 )) || status=1; \
	exit $$status

e2e: setup
	$(PYTEST) -m e2e e2e -v

# The broker and operator images (scripts/images.sh): podman, runc and debootstrap are
# installed when missing, the base is a local debootstrap of Debian bookworm (no registry),
# and each image's size is printed. ENGINE=docker builds on python:3.11-slim-bookworm.
images:
	@bash scripts/images.sh all

# The container suite (docs/containers.md): the images' own tests (uid 10001, read-only,
# HEALTHCHECK, SIGTERM) and a group as containers through podman kill, pause, network
# disconnects and a restart, judged by the drill's checker. Skips with the reason where
# podman cannot run containers. Not part of `make test`.
e2e-containers: setup
	@if bash scripts/images.sh all && bash scripts/images.sh zookeeper; then :; else \
		echo "e2e-containers: the images could not be built; the suite will say why it skips"; fi
	$(PYTEST) e2e_containers -v -s -p no:cacheprovider --timeout=1800

clean:
	rm -rf .understudy bench-results .pytest_cache .mypy_cache .ruff_cache
