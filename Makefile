VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test lint bench-lookup bench-ttft venv demo

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3

venv: $(PY)
	$(PY) -m pip install --quiet -e '.[test]'

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest

lint: venv
	$(VENV)/bin/ruff check .

bench-lookup: venv
	$(PY) benchmarks/lookup.py

demo: venv
	@for trace in examples/*.jsonl; do \
		echo "== $$trace"; \
		$(VENV)/bin/junction replay $$trace --runner ledger --block-size 16 \
			--mamba-block-size 512 --prefix-match-unit 16 --junction-checkpoints \
			--out /dev/null; \
	done

bench-ttft: venv
	$(PY) benchmarks/ttft.py
