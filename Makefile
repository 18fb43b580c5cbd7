VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test lint bench-lookup bench-ttft bench-vllm bench-pressure bench-tiers bench-whatif venv demo run peer

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3

# pip runs only when pyproject.toml is newer than the stamp of what it installed: `make run`
# needs Junction alone, `make test` (and the benchmarks) its test extras too, which cover the
# runtime's install as well
RUNTIME_STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

$(RUNTIME_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

$(TEST_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(TEST_STAMP) $(RUNTIME_STAMP)

venv: $(TEST_STAMP)

# engine options after --: make run ARGS="--runner ledger -- --block-size 64"
run: $(RUNTIME_STAMP)
	$(VENV)/bin/junction up $(ARGS)

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest

lint: venv
	$(VENV)/bin/ruff check .

bench-lookup: venv
	$(PY) benchmarks/lookup.py

bench-ttft: venv
	$(PY) benchmarks/ttft.py

# Junction beside vLLM 0.33 in one run: hits per request, hashing, lookups, the replay loop
bench-vllm: venv peer
	$(PY) benchmarks/vs_vllm.py

bench-pressure: venv peer
	$(PY) benchmarks/pressure.py

# no `peer` prerequisite: tiers.py runs vLLM with its CPU offloading when .venv-peer exists
bench-tiers: venv
	$(PY) benchmarks/tiers.py

demo: venv
	bash examples/demo.sh

# vLLM 0.33 as a peer (benchmarks/peer/): its own venv, rebuilt when its pins or script change
PEER_STAMP := .venv-peer/.built

peer: $(PEER_STAMP)

$(PEER_STAMP): benchmarks/peer/requirements.txt benchmarks/peer/build.sh
	rm -f $(PEER_STAMP)
	bash benchmarks/peer/build.sh
	touch $(PEER_STAMP)

# what-if miss-ratio curves: the exact LRU curve beside SHARDS (100k requests), sampled replays
bench-whatif: venv
	$(PY) benchmarks/whatif.py
