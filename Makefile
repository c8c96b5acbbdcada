# Set-up, demo and tests. Every target creates .venv when it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=

.PHONY: setup demo test test-slow bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU torch first: an unpinned torch would pull a multi-GB CUDA build. Where PyPI's
	# torch is a CUDA build, pass TORCH_INDEX=https://download.pytorch.org/whl/cpu.
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# faiss-cpu comes with the cpu extra (a GPU machine takes the gpu extra's faiss instead).
	$(BIN)/python -m pip install -q -e '.[dev,cpu]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mopd demo

# The default suite: everything but the long end-to-end tests (marked slow), under 10 minutes on a
# loaded 2-core machine. CI (.ci/run) runs both targets.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests

bench: $(STAMP)
	$(BIN)/python -m pytest -q bench --benchmark-only

lint: $(STAMP)
	$(BIN)/ruff check mopd tests bench

clean:
	rm -rf $(VENV) build *.egg-info
