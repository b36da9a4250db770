# Quick start: `make demo` builds the newcomer's demo recipe (every capability once, about 7 minutes on 2 cores from
# nothing); `make demo-full` the full showcase (the committed artifacts); `make test` runs the whole suite (what CI runs).
# Both install what they need: a virtualenv (.venv), pinned Python deps and the pinned llama.cpp tools
# (built once into $(CACHE), outside the clone, in a folder keyed by everything that shapes them).
# `make test-fast`: ruff and the unit tier in a light venv (.venv-fast), no llama.cpp, no torch.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
FAST   := .venv-fast
CACHE  := $(or $(GGUFPIPE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ggufpipe)
LLAMA_BUILD := b11312
CORES  ?= all
PYTEST_ARGS ?=
DEMO_RECIPE  := recipes/quick/smollm2-135m-quick.yaml
DEMO_NAME    := smollm2-135m-quick
FULL_RECIPE  := recipes/smollm2-135m.yaml
FULL_NAME    := smollm2-135m
CALIB_RECIPE := recipes/smollm2-135m-calib.yaml
DEMO_ENV = HF_HUB_OFFLINE=1 HF_HUB_CACHE=$(CACHE)/demo/hub

export GGUFPIPE_CACHE := $(CACHE)
# When the run began, for the progress lines' elapsed time (exported: the sub-makes keep the first make's)
ifndef DEMO_START
DEMO_START := $(shell date +%s)
endif
export DEMO_START
T = $$(s=$$(( $$(date +%s) - $(DEMO_START) )); printf '%d:%02d' $$((s / 60)) $$((s % 60)))

.PHONY: venv locks tools tools-build python-setup pyc setup demo demo-full demo-calib demo-mix bench-mix dvc-repro test \
	test-fast lint docs \
	clean-work clean-logits bench
.DEFAULT_GOAL := demo

# The build environment (pipeline/envs.py): Snakemake, DVC, the stages and the reference side, from its lock
# (requirements/build.lock, resolved from pyproject.toml's extras), then this checkout, editable. pip only fetches
# uv, which installs every environment. uv reads no pip.conf, so it gets this machine's package sources from pip's
# configuration (the local CPU torch wheel lies in a find-links folder). Unlike pip, uv writes no bytecode unless
# asked: every stage and Snakemake run is a fresh interpreter, and under PYTHONDONTWRITEBYTECODE (set on some build
# boxes) each would compile pandas, torch and transformers from source again (docs/environments.md).
UV_VERSION := 0.13.9
UV := $(BIN)/uv
UV_SOURCES = $(foreach f,$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null),--find-links $(f))
$(BIN)/.installed: pyproject.toml requirements/build.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)
	@$(PYTHON) -m pipeline.envs check-lock requirements/build.lock
	$(UV) pip sync -q --compile-bytecode --python $(BIN)/python $(UV_SOURCES) requirements/build.lock
	$(UV) pip install -q --python $(BIN)/python --no-deps -e .
	rm -f $(BIN)/.gguf-py-*
	touch $@

venv: $(BIN)/.installed

# The environments by concern (pipeline/envs.py), each from its lock, into $(VENV)/envs/<name>: `make env-converter`,
# `make env-autoawq`; the targets that build recipes make the ones they need.
ENVS_DIR := $(VENV)/envs
$(ENVS_DIR)/%/.installed: requirements/%.lock | $(BIN)/.installed
	@$(PYTHON) -m pipeline.envs check-lock $<
	$(UV) venv -q --allow-existing --python $(PYTHON) $(ENVS_DIR)/$*
	$(UV) pip sync -q --compile-bytecode --python $(ENVS_DIR)/$*/bin/python $(UV_SOURCES) $<
	touch $@

env-%: $(ENVS_DIR)/%/.installed
	@:
.PRECIOUS: $(ENVS_DIR)/%/.installed

# Re-resolve the locks from requirements/<name>.in (CPython 3.11, this machine's package sources); check the diff.
# build.excludes: llm-compressor's nvidia-ml-py (NVML bindings, unused on the CPU).
locks: $(BIN)/.installed
	$(UV) pip compile -q --python-version 3.11 $(UV_SOURCES) --generate-hashes pyproject.toml --extra build \
		--extra cluster --extra dev --extra lint --excludes requirements/build.excludes -o requirements/build.lock
	$(UV) pip compile -q --python-version 3.11 $(UV_SOURCES) --generate-hashes requirements/converter.in \
		-o requirements/converter.lock
	$(UV) pip compile -q --python-version 3.11 $(UV_SOURCES) --generate-hashes requirements/autoawq.in \
		-c requirements/constraints.txt --excludes requirements/autoawq.excludes -o requirements/autoawq.lock

# The pinned llama.cpp tools into the cache (a no-op when that folder exists). pipeline/tools.py is standard
# library only, so this runs with the system Python and needs no venv: `setup` builds both at once.
# `make tools BACKEND=cuda CUDA_ARCHS=90`: the same tree with CUDA, opt-in, into its own folder (docs/gpu.md).
# `make tools ARCH=aarch64 PROFILE=cortex-a76`: the device tools cross-built for an ARM core (docs/devices.md#arm); on
# an aarch64 build box `make tools PROFILE=...` gives its own tools the profile's -march (GGUFPIPE_CPU_PROFILE).
BACKEND    ?= cpu
CUDA_ARCHS ?=
ARCH       ?=
PROFILE    ?=
ifneq ($(PROFILE),)
export GGUFPIPE_CPU_PROFILE := $(PROFILE)
endif
TOOLS_TARGET = $(if $(ARCH), --arch $(ARCH))$(if $(PROFILE), --profile $(PROFILE))
tools-build:
	$(PYTHON) -m pipeline.tools install$(if $(STAGED), --staged)$(if $(filter-out cpu,$(BACKEND)), --backend $(BACKEND))$(if $(CUDA_ARCHS), --cuda-archs '$(CUDA_ARCHS)')$(TOOLS_TARGET)

# Then the gguf-py of that tree into the venv: the pipeline reads GGUFs with the same gguf-py that the pinned
# tools come with (PyPI's gguf lacks newer types). Unpacked from the sdist (`gguf-py --source`: the same files as the
# compiled tools' convert/gguf-py), so that it needs no compile and the venv is ready while cmake still runs.
$(BIN)/.gguf-py-$(LLAMA_BUILD): $(BIN)/.installed
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python --no-deps --reinstall "$$($(BIN)/python -m pipeline.tools gguf-py --source)"
	touch $@

# venv and llama.cpp build side by side (pip waits on the network and unpacks while cmake compiles)
ifneq ($(BACKEND),cpu)
tools: export GGUFPIPE_BACKEND := $(BACKEND)
tools: export GGUFPIPE_CUDA_ARCHS := $(CUDA_ARCHS)
endif
ifneq ($(ARCH),)
tools:  # a cross build: the device tools only, no venv
	@$(MAKE) --no-print-directory tools-build
else
tools:
	@$(MAKE) --no-print-directory -j2 venv tools-build
	@$(MAKE) --no-print-directory $(BIN)/.gguf-py-$(LLAMA_BUILD)
endif

# Bytecode of the pipeline package, which the editable install leaves uncompiled: every stage is a fresh
# interpreter, and under PYTHONDONTWRITEBYTECODE (set on some build boxes) each one compiled the modules
# it imports from source again: 0.07 s per stage, 10 stages a demo build. Stale files are recompiled.
pyc: venv
	$(BIN)/python -m compileall -q pipeline

# Everything a build or the suite needs, in two lanes side by side: the llama.cpp compile (the long pole; its
# progress as a percentage) and the Python side (venv, gguf-py, converter environment, bytecode, demo snapshot), which
# waits on the network and unpacks while cmake compiles. One [setup] line per step, with the time since the start.
setup:
	@echo "[setup 1/6 $(T)] llama.cpp $(LLAMA_BUILD) tools into $(CACHE), beside the Python side; first run only"
	@$(MAKE) --no-print-directory -j2 tools-build python-setup STAGED=1

python-setup:
	@echo "[setup 2/6 $(T)] Python venv ($(VENV)) from requirements/build.lock"
	@$(MAKE) --no-print-directory $(BIN)/.installed
	@echo "[setup 3/6 $(T)] gguf-py of llama.cpp $(LLAMA_BUILD) into the venv"
	@$(MAKE) --no-print-directory $(BIN)/.gguf-py-$(LLAMA_BUILD)
	@echo "[setup 4/6 $(T)] the converter environment ($(ENVS_DIR)/converter): every build converts"
	@$(MAKE) --no-print-directory env-converter
	@echo "[setup 5/6 $(T)] bytecode of the pipeline package"
	@$(MAKE) --no-print-directory pyc
	@echo "[setup 6/6 $(T)] demo snapshot: SmolLM2-135M-Instruct as a local Hugging Face cache, eval text"
	@$(BIN)/python -m pipeline.cli setup-demo

# The newcomer's demo: one progress line per step with the time since `make demo` began, the card's path at the end
# (Snakemake's whole output in work/<name>/logs/demo.log)
demo: setup
	@echo "[demo $(T)] snakemake --cores $(CORES): $(DEMO_RECIPE) and its draft -> artifacts/$(DEMO_NAME)/"
	@$(DEMO_ENV) $(BIN)/python -m pipeline.progress --since $(DEMO_START) --log work/$(DEMO_NAME)/logs/demo.log \
		--card artifacts/$(DEMO_NAME)/README.md -- $(BIN)/snakemake --cores $(CORES) --config recipes=$(DEMO_RECIPE)

# The full showcase (every axis, KV types, long context, Chinese and code): what `make dvc-repro` and the committed
# artifacts build, and what docs/ shows
demo-full: setup
	@echo "[demo-full $(T)] snakemake --cores $(CORES): $(FULL_RECIPE) and its draft -> artifacts/$(FULL_NAME)/"
	@$(DEMO_ENV) $(BIN)/python -m pipeline.progress --label demo-full --since $(DEMO_START) \
		--log work/$(FULL_NAME)/logs/demo.log --card artifacts/$(FULL_NAME)/README.md -- \
		$(BIN)/snakemake --cores $(CORES) --config recipes=$(FULL_RECIPE)

# The calibration demo: plain / imatrix / AWQ / AWQ+imatrix flavours (AutoAWQ on the CPU is the long pole).
demo-calib: setup env-autoawq
	@echo "[demo-calib] snakemake --cores $(CORES): $(CALIB_RECIPE) -> artifacts/"
	$(DEMO_ENV) $(BIN)/snakemake --cores $(CORES) --config recipes=$(CALIB_RECIPE)

# Measured mixes against the stock K quants on the rotated demo model (docs/mixes.md; ~25 min on 2 cores, most of
# it the sensitivity measurement); `make bench-mix` then prints the targets of issue #19.
MIX_RECIPE := recipes/mix/smollm2-135m-mix.yaml
demo-mix: setup
	@echo "[demo-mix] rotated demo snapshot, then snakemake --cores $(CORES): $(MIX_RECIPE) -> artifacts/"
	@$(BIN)/python -m pipeline.cli setup-demo --rotated > /dev/null
	$(DEMO_ENV) $(BIN)/snakemake --cores $(CORES) --config recipes=$(MIX_RECIPE)

bench-mix: demo-mix
	$(DEMO_ENV) $(BIN)/python bench/mix_bench.py $(MIX_RECIPE)

# DVC over the same workflow (dvc.yaml), every recipe: each stage runs `python -m ...` from the venv
dvc-repro: setup env-autoawq
	PATH=$(abspath $(BIN)):$$PATH $(DEMO_ENV) $(BIN)/dvc repro --keep-going

# The whole suite, tiers in order (tests/unit, tests/integration, tests/e2e): what CI runs. In one process it
# leaves one of CI's two cores mostly idle (docs/testing.md), so it runs on two workers; tests/helpers/workers.py
# sends each shared build's tests to one worker (built once), the unit tier first. TEST_WORKERS=0: one process.
# Two workers start 2-thread llama.cpp and torch runs on two cores: OpenMP threads that spin while they wait take
# the core the other worker needs; passive waiting halves two such runs' wall (docs/testing.md).
TEST_WORKERS ?= 2
test: setup env-autoawq
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The light venv: core + dev extras (pyyaml, pytest, ruff, numpy, gguf); no torch, no snakemake, no llama.cpp.
$(FAST)/bin/.installed: pyproject.toml requirements/constraints.txt
	test -x $(FAST)/bin/python || $(PYTHON) -m venv $(FAST)
	$(FAST)/bin/python -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	touch $@

# ruff and the unit tier, under 2 minutes from a fresh clone (pip's cache warm)
test-fast: $(FAST)/bin/.installed
	$(FAST)/bin/ruff check pipeline tests bench
	$(FAST)/bin/python -m pytest tests/unit -q $(PYTEST_ARGS)

# Every linter, pinned (pyproject.toml): CI runs this before the tests. snakemake --lint loads the recipes,
# which checks their quant types against the installed llama-quantize.
lint: tools
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/snakefmt --check Snakefile
	$(BIN)/python -m pipeline.recipe.docs --check
	$(BIN)/snakemake --lint

# docs/recipes.md from the recipe schema (pipeline/recipe/schema.py)
docs: venv
	$(BIN)/python -m pipeline.recipe.docs

clean-work:
	rm -rf work

# the base logits (work/<name>/eval/<set>/base.logits, the largest intermediates) emptied to stubs: nothing
# re-runs; the eval of a quant added later recomputes them once
clean-logits: venv
	$(BIN)/python -m pipeline.cli clean-logits

# pipeline overhead, no-op re-run, add-one-quant, --cores 1 vs 2, peak memory and disk (bench/pipeline_bench.py)
bench: setup
	$(BIN)/python bench/pipeline_bench.py
