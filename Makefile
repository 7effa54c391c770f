# `make run` and `make test` do all set-up on a fresh machine: a virtual environment in .venv,
# the project installed into it (editable), then the broker or the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOADGEN := loadtest/bin/rrclient loadtest/bin/connclient

.PHONY: install run test bench loadgen clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install
	mkdir -p data
	$(PY) -m broker --config config/server.properties

test: install loadgen
	$(PY) -m pytest -q tests

loadgen: $(LOADGEN)

loadtest/bin/%: loadtest/%.c
	mkdir -p loadtest/bin
	$${CC:-gcc} -O2 -Wall -o $@ $<

bench: install loadgen
	$(PY) -m loadtest.bench

clean:
	rm -rf $(VENV) loadtest/bin .pytest_cache
