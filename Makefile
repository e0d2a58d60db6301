# loadkit: `make demo` and `make test` work on a fresh machine (they create .venv themselves).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench bench-doors bench-scaling soak clean models browser prometheus socat

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[embedded,dev]'
	touch $(STAMP)

# Rebuild the ONNX CNN from its fixed seed (the committed file is identical).
models: setup
	$(BIN)/python scripts/build_cnn_onnx.py

demo: setup
	$(BIN)/loadkit run scenarios/quickstart.yaml

lint: setup
	$(BIN)/ruff check loadkit tests scripts bench locustfile.py

# The web UI test drives Debian's Chromium with Playwright (never a browser download).
browser:
	@command -v chromium >/dev/null || { test "$$(id -u)" = 0 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "loadkit: could not install chromium (needs root and apt); the web UI test will skip"

# The dashboard test evaluates every query in a real Prometheus: Debian's package (2.42).
prometheus:
	@command -v prometheus >/dev/null || { test "$$(id -u)" = 0 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; } || \
	  echo "loadkit: could not install prometheus (needs root and apt); the dashboard test will skip"

# Two pytest workers (pytest-xdist), each with its own session Triton, sharing the tests one by
# one; a file with module fixtures (a shared run, a server of its own) is one xdist_group, run
# whole on one worker. On the 2-core CI machine the serial suite took 24 min with the CPUs 41%
# busy (docs/architecture.md, Tests). TEST_JOBS=0 runs it serially in one process.
TEST_JOBS ?= 2
PYTEST_JOBS = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadgroup)
# socat (Debian's, OpenSSL inside): the TLS end in front of Triton's HTTP port for the https test
socat:
	@command -v socat >/dev/null || { test "$$(id -u)" = 0 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq socat >/dev/null; } || \
	  echo "loadkit: could not install socat (needs root and apt); the https test will skip"

test: setup lint browser prometheus socat
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_JOBS) --durations=15

# Pure units only (marker `fast`: no server, no child process), in seconds.
test-fast: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -m fast

# loadkit vs perf_analyzer (C++) on the same embedded Triton, A B pairs; results in bench/results/.
bench: setup
	bash bench/setup_perf_analyzer.sh
	$(BIN)/python bench/run.py
	$(BIN)/python bench/streaming.py

# 1 vs N worker processes (Locust master + workers): throughput, CPU per request, rate split.
# loadkit and perf_analyzer through each door (gRPC, HTTP/REST) on dense and a 602 KB input.
bench-doors: setup
	bash bench/setup_perf_analyzer.sh
	$(BIN)/python bench/doors.py

bench-scaling: setup
	$(BIN)/python bench/scaling.py

soak: setup
	$(BIN)/python -m pytest -q -m soak -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
