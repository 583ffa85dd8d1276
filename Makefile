# Two entry points for a fresh machine: `make run` (the workflow on the embedded local default)
# and `make test` (the whole test suite). Both create .venv/ and install the project if needed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install install-profile clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/snakemake --cores 2 all
	$(BIN)/snakemake --report results/report.html

# Two pytest workers, one test module each at a time (module fixtures are built once); TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
# tests/system_guard.py records the machine's /usr/bin (through its links) and the user's trm and snakemake
# folders before the suite and fails the run if the suite changed any of them.
GUARD := $(VENV)/system-guard.json
test: $(STAMP)
	$(BIN)/ruff check trm tests benchmarks
	$(BIN)/python tests/system_guard.py snapshot $(GUARD)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile; status=$$?; \
	$(BIN)/python tests/system_guard.py compare $(GUARD) || status=1; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check trm tests benchmarks
	$(BIN)/ruff format --check trm tests benchmarks

# Snakemake finds `--profile NAME` only in the current directory and ~/.config/snakemake: link the TPU profile
# there, so `snakemake --profile tpu-v4-64` works from the repository root (docs/tpu.md).
PROFILE_HOME ?= $(HOME)/.config/snakemake
install-profile:
	mkdir -p $(PROFILE_HOME)
	ln -sfn $(CURDIR)/profiles/tpu-v4-64 $(PROFILE_HOME)/tpu-v4-64
	@echo "installed: $(PROFILE_HOME)/tpu-v4-64 -> $(CURDIR)/profiles/tpu-v4-64"

clean:
	rm -rf results .snakemake
