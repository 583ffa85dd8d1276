# Entry points for a fresh machine. `make run` installs what the study needs and runs it on this CPU;
# `make test` adds the test tools and extras and runs the whole suite (what CI runs: .ci/run); `make test-fast`
# runs the fast tests only. They create .venv/.
#   make install        the study's runtime only (what `make run` uses)
#   make install-test   runtime + test extras (what `make test` and `make lint` use)
#   make PYTHON=/path/to/python3.12 ...   choose the interpreter (3.11, 3.12 or 3.13)

# The first of python3.11, python3.12, python3.13 and python3 that runs and is a supported version
# (3.11 first: the version CI tests).
SUPPORTED_PYTHON := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3; do \
	$$p -c '$(SUPPORTED_PYTHON)' >/dev/null 2>&1 && { echo $$p; exit; }; done; echo python3)
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test
# A failed step removes the venv it was building, so the next `make` starts clean instead of reusing half of it.
UNDO := { rm -rf $(VENV); echo "make: install failed; $(VENV) removed" >&2; exit 1; }
# A venv left by an unsupported interpreter (say, an earlier python3 = 3.10) is removed with a note, not reused.
CHECK_VENV := $(BIN)/python -c '$(SUPPORTED_PYTHON)' 2>/dev/null || { echo "make: $(VENV) was made with" \
	"$$($(BIN)/python --version 2>&1), not 3.11-3.13: removed it; run make again" >&2; rm -rf $(VENV); exit 1; }

.PHONY: run test test-fast lint install install-test install-profile clean

$(VENV)/bin/python:
	@$(PYTHON) -c '$(SUPPORTED_PYTHON)' 2>/dev/null || { echo "make: $(PYTHON) is not Python 3.11-3.13" \
		"($$($(PYTHON) --version 2>&1)); install one, or run make PYTHON=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV) || $(UNDO)
	$(BIN)/pip install --quiet --upgrade pip || $(UNDO)

$(RUNTIME): pyproject.toml | $(VENV)/bin/python
	@$(CHECK_VENV)
	$(BIN)/pip install --quiet -e . || $(UNDO)
	touch $@

$(TESTING): pyproject.toml | $(VENV)/bin/python
	@$(CHECK_VENV)
	$(BIN)/pip install --quiet -e '.[test]' || $(UNDO)
	touch $@ $(RUNTIME)

install: $(RUNTIME)
install-test: $(TESTING)

run: $(RUNTIME)
	$(BIN)/snakemake --cores all all
	$(BIN)/snakemake --report results/report.html

# Three pytest workers, one test module each at a time (module fixtures are built once), the longest modules first
# (tests/conftest.py, LONGEST_MODULES; --no-loadscope-reorder keeps that order); TEST_WORKERS=0 runs serially.
# Three, even on 2 cores: the suite's subprocesses wait on one another, and a third worker fills those waits
# (docs/testing.md has the measurements).
# tests/system_guard.py records the machine's /usr/bin (through its links) and the user's trm and snakemake
# folders before the suite and fails the run if the suite changed any of them.
TEST_WORKERS ?= 3
GUARD := $(VENV)/system-guard.json
test: $(TESTING)
	$(BIN)/ruff check trm tests benchmarks
	$(BIN)/python tests/system_guard.py snapshot $(GUARD)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder; status=$$?; \
	$(BIN)/python tests/system_guard.py compare $(GUARD) || status=1; exit $$status

# The loop while editing: every test not marked slow, multihost, workflow or tpu (the markers: pyproject.toml,
# docs/testing.md), on the same workers. CI runs `make test`, which runs every test.
FAST_TESTS := not slow and not multihost and not workflow and not tpu
test-fast: $(TESTING)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "$(FAST_TESTS)"

lint: $(TESTING)
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
