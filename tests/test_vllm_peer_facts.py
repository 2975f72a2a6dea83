"""The vLLM peer benchmark's record of what vLLM ran with: read from a canned start-up log and
a canned `vllm_facts.py` answer, with gaps (a log that says little, an interpreter that fails)
recorded as ``None`` and a reason, never an error. vLLM itself is not run here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# Start-up lines as vLLM 0.32.0's CPU build writes them (its config line shortened).
LOG = """\
(APIServer pid=2211) INFO 12-05 10:01:02 [utils.py:253] non-default args: {'model': '/m', 'dtype': 'float32'}
(EngineCore pid=2290) INFO 12-05 10:01:09 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/m', speculative_config=SpeculativeConfig(method='ngram', num_spec_tokens=5), tokenizer='/m', \
skip_tokenizer_init=False, dtype=torch.float32, max_seq_len=4096, download_dir=None, \
quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cpu, seed=0, \
enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, \
compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, 'debug_dump_path': None, \
'backend': 'inductor', 'custom_ops': ['none'], 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, \
'cudagraph_capture_sizes': []}, kernel_config=KernelConfig(moe_backend='auto')
(EngineCore pid=2290) WARNING 12-05 10:01:10 [cpu_worker.py:130] Speculative decoding on CPU \
without Intel OpenMP in LD_PRELOAD will cause significant performance loss.
(EngineCore pid=2290) WARNING 12-05 10:01:10 [cpu_worker.py:130] Speculative decoding on CPU \
without Intel OpenMP in LD_PRELOAD will cause significant performance loss.
(EngineCore pid=2290) INFO 12-05 10:01:11 [cpu_model_runner.py:87] Warming up model for the compilation...
"""

# `vllm_facts.py`'s answer on a Sapphire Rapids-class Xeon (vLLM 0.32.0), one method.
FACTS = {
    "version": "0.32.0",
    "platform": {"device_type": "cpu", "cpu_architecture": "X86", "cpu_capability": "AVX512"},
    "methods": {
        "vllm_ngram": {
            "attention_backend": "CPU_ATTN",
            "linear_kernel": "oneDNN onednn_mm",
            "compilation": {"mode": "DYNAMO_TRACE_ONCE", "cudagraph_mode": "NONE"},
            "speculative": {"method": "ngram", "num_speculative_tokens": 5},
        },
        "vllm_suffix": None,
    },
    "unknown": {"methods.vllm_suffix": "ImportError: Arctic Inference is required for suffix decoding."},
}


@pytest.fixture
def peer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports its neighbours
    import vllm_peer

    return vllm_peer


def test_the_start_up_log_gives_the_engine_s_configuration(peer: ModuleType) -> None:
    facts = peer.startup_facts(LOG)
    assert facts["version"] == "0.32.0"
    assert facts["dtype"] == "torch.float32" and facts["max_seq_len"] == "4096"
    assert facts["enable_prefix_caching"] is True and facts["enable_chunked_prefill"] is True
    assert facts["enforce_eager"] == "False" and facts["kv_cache_dtype"] == "auto"
    assert facts["compilation_mode"] == "DYNAMO_TRACE_ONCE" and facts["compilation_backend"] == "inductor"
    assert facts["cudagraph_mode"] == "NONE"
    assert facts["v2_model_runner"] is False
    assert facts["warnings"] == [
        "Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause significant "
        "performance loss."
    ]
    # CPU_ATTN is chosen without a log line: the log does not say, the facts script does
    assert facts["attention_backend"] is None and "attention_backend" in facts["unknown"]


def test_a_named_backend_is_read(peer: ModuleType) -> None:
    facts = peer.startup_facts(LOG + "(EngineCore pid=1) INFO [cpu.py:163] Using AMX_MLA backend.\n")
    assert facts["attention_backend"] == "AMX_MLA" and "attention_backend" not in facts.get("unknown", {})


def test_a_log_without_the_config_line_leaves_gaps(peer: ModuleType) -> None:
    facts = peer.startup_facts("Traceback (most recent call last):\n  ...\n")
    assert facts["version"] is None and "config" in facts["unknown"]
    assert facts["warnings"] == [] and facts["v2_model_runner"] is False


def _fake_python(tmp_path: Path, body: str) -> str:
    """An "interpreter": a shell script that runs ``body`` (given the facts script's arguments)."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_the_facts_script_s_answer_is_the_record(peer: ModuleType, tmp_path: Path) -> None:
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps(FACTS))
    # writes the canned answer where --out says
    python = _fake_python(
        tmp_path, f'while [ "$1" != --out ]; do shift; done; cp {answer} "$2"; echo noise; echo noise >&2'
    )
    methods = {"vllm_ngram": peer.NGRAM, "vllm_suffix": peer.SUFFIX}
    assert peer.vllm_facts(python, "/m", methods) == FACTS


@pytest.mark.parametrize(
    "body",
    ["echo 'ModuleNotFoundError: vllm' >&2; exit 1", "exit 0", "exec sleep 5"],
    ids=["fails", "silent", "hangs"],
)
def test_a_failing_interpreter_gives_nulls_and_why(peer: ModuleType, tmp_path: Path, body: str) -> None:
    facts = peer.vllm_facts(_fake_python(tmp_path, body), "/m", {"vllm_plain": None}, timeout=1.0)
    assert facts["version"] is None and facts["platform"] is None
    assert facts["methods"] == {"vllm_plain": None}
    assert facts["unknown"]["all"]


def test_a_missing_interpreter_gives_nulls_and_why(peer: ModuleType, tmp_path: Path) -> None:
    facts = peer.vllm_facts(str(tmp_path / "no-python"), "/m", {"vllm_plain": None})
    assert facts["version"] is None and "FileNotFoundError" in facts["unknown"]["all"]


def test_the_facts_script_without_vllm_says_why(tmp_path: Path) -> None:
    """Run by an interpreter without vLLM (this one): every fact null, each with the reason."""
    out = tmp_path / "facts.json"
    argv = ["--model", "/m", "--methods", json.dumps({"vllm_plain": None}), "--out", str(out)]
    spec = importlib.util.spec_from_file_location("vllm_facts", BENCHMARKS / "vllm_facts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this interpreter")
    assert module.main(argv) == 0
    facts = json.loads(out.read_text())
    assert facts["version"] is None and facts["platform"] is None and facts["methods"] == {"vllm_plain": None}
    assert set(facts["unknown"]) == {"version", "platform", "methods.vllm_plain"}
    assert all("vllm" in why for why in facts["unknown"].values())
