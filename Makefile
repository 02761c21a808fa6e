# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when what the build reads has changed.
STAMP := $(VENV)/.fastpath-installed
BUILD_INPUTS := pyproject.toml CMakeLists.txt $(shell find cpp -type f 2>/dev/null)

.PHONY: venv test lint demo clean

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	@# torch first, pinned, so the editable install never pulls a multi-GB CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev,guided,serve]'
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m fastpath.schema.export --check
	$(BIN)/python bin/compile --check examples/*.yaml
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python bin/demo

clean:
	rm -rf build generated/*/build $(VENV)
