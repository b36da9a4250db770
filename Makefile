# Quick start: `make demo` builds the embedded demo recipe; `make test` runs the test suite.
# Both install what they need: a virtualenv (.venv), pinned Python deps and the pinned llama.cpp tools
# (built once into $(CACHE), outside the clone, keyed by the llama.cpp build number).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CACHE  := $(or $(GGUFPIPE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ggufpipe)
LLAMA_BUILD := b11312
CORES  ?= all
PYTEST_ARGS ?=

export GGUFPIPE_CACHE := $(CACHE)

.PHONY: venv tools pyc demo dvc-repro test lint clean-work clean-logits bench
.DEFAULT_GOAL := demo

# Virtualenv with pinned deps. torch goes first and pinned, so pip takes the local CPU wheel.
$(BIN)/.installed: pyproject.toml requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[build,cluster,dev]'
	# AutoAWQ 0.2.9 is archived upstream: installed without its declared deps (see pyproject.toml)
	$(BIN)/python -m pip install -q --no-deps autoawq==0.2.9
	rm -f $(BIN)/.gguf-py-*
	touch $@

venv: $(BIN)/.installed

# llama.cpp tools (no-op when installed), then the gguf-py of that tree into the venv: the pipeline
# reads GGUFs with the same gguf-py that the pinned tools come with (PyPI's gguf lacks newer types).
$(BIN)/.gguf-py-$(LLAMA_BUILD): $(BIN)/.installed
	$(BIN)/python -m pipeline.tools install
	$(BIN)/python -m pip install -q --no-deps --force-reinstall "$$($(BIN)/python -m pipeline.tools gguf-py)"
	touch $@

tools: $(BIN)/.gguf-py-$(LLAMA_BUILD)

# Bytecode of the pipeline package, which the editable install leaves uncompiled: every stage is a fresh
# interpreter, and under PYTHONDONTWRITEBYTECODE (set on some build boxes) each one compiled the modules
# it imports from source again: 0.07 s per stage, 10 stages a demo build. Stale files are recompiled.
pyc: venv
	$(BIN)/python -m compileall -q pipeline

demo: tools pyc
	$(BIN)/python -m pipeline.cli setup-demo
	HF_HUB_OFFLINE=1 HF_HUB_CACHE=$(CACHE)/demo/hub $(BIN)/snakemake --cores $(CORES)

# DVC over the same workflow (dvc.yaml): each stage runs `python -m ...` from the venv
dvc-repro: tools pyc
	$(BIN)/python -m pipeline.cli setup-demo
	PATH=$(abspath $(BIN)):$$PATH HF_HUB_OFFLINE=1 HF_HUB_CACHE=$(CACHE)/demo/hub $(BIN)/dvc repro --keep-going

test: tools pyc
	$(BIN)/python -m pipeline.cli setup-demo
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/snakemake --lint

clean-work:
	rm -rf work

# the base logits (work/<name>/eval/<set>/base.logits, the largest intermediates) emptied to stubs: nothing
# re-runs; the eval of a quant added later recomputes them once
clean-logits: venv
	$(BIN)/python -m pipeline.cli clean-logits

# pipeline overhead, no-op re-run, add-one-quant, --cores 1 vs 2, peak memory and disk (bench/pipeline_bench.py)
bench: tools pyc
	$(BIN)/python -m pipeline.cli setup-demo
	$(BIN)/python bench/pipeline_bench.py
