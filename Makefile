VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test lint bench-lookup bench-ttft venv demo run

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3

venv: $(PY)
	$(PY) -m pip install --quiet -e '.[test]'

# engine options after --: make run ARGS="--runner ledger -- --block-size 64"
run: venv
	$(VENV)/bin/junction up $(ARGS)

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest

lint: venv
	$(VENV)/bin/ruff check .

bench-lookup: venv
	$(PY) benchmarks/lookup.py

demo: venv
	bash examples/demo.sh
