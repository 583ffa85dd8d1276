# Two entry points for a fresh machine: `make run` (the workflow on the embedded local default)
# and `make test` (the whole test suite). Both create .venv/ and install the project if needed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/snakemake --cores 2 all
	$(BIN)/snakemake --report results/report.html

test: $(STAMP)
	$(BIN)/ruff check trm tests benchmarks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check trm tests benchmarks
	$(BIN)/ruff format --check trm tests benchmarks

clean:
	rm -rf results .snakemake
