"""What vLLM runs with on this machine, as a JSON file: its version, the platform it found,
and for each speculative setting the configuration its OpenAI server would build from the same
arguments (runner, attention backend, compilation and CUDA graphs, batching, caching).

Run by vLLM's own interpreter (`vllm_peer.py` does, with ``--vllm-python``); it imports vLLM only
there, and loads no weights. A fact it cannot read is ``null``, and ``unknown`` says why.

    VENV/bin/python benchmarks/vllm_facts.py --model DIR --methods '{"vllm_plain": null}' \
        --out facts.json -- --max-model-len 4096 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model directory the servers load")
    parser.add_argument("--methods", required=True, help="JSON: method name -> speculative config or null")
    parser.add_argument("--out", required=True, help="the JSON file to write (vLLM prints to stdout too)")
    parser.add_argument("server_args", nargs="*", help="after --: the servers' other arguments")
    args = parser.parse_args(argv)
    facts: dict[str, Any] = {"version": None, "platform": {}, "methods": {}, "unknown": {}}
    unknown = facts["unknown"]
    facts["version"] = _fact("version", _version, unknown)
    facts["platform"] = _fact("platform", _platform, unknown)
    for method, spec in json.loads(args.methods).items():
        command = ["--model", args.model, *args.server_args]
        if spec is not None:
            command += ["--speculative-config", json.dumps(spec)]
        facts["methods"][method] = _fact(f"methods.{method}", partial(_config, command), unknown)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(facts, out, default=str)
    return 0


def _fact(name: str, read: Callable[[], Any], unknown: dict[str, str]) -> Any:
    """``read()``, or ``None`` with the reason under ``unknown[name]``: a vLLM that moved an
    internal leaves a gap in the record, not a failed benchmark."""
    try:
        return read()
    except Exception as error:  # any failure is a fact not read, whatever vLLM raised
        unknown[name] = f"{type(error).__name__}: {error}"
        return None


def _version() -> str:
    import vllm

    return str(vllm.__version__)


def _platform() -> dict[str, Any]:
    import torch
    from vllm.platforms import current_platform

    unknown: dict[str, str] = {}
    found = {
        "device_type": current_platform.device_type,
        "torch": torch.__version__,
        "cpu_architecture": _fact(
            "cpu_architecture", lambda: current_platform.get_cpu_architecture().name, unknown
        ),
        "cpu_capability": _fact("cpu_capability", torch.backends.cpu.get_cpu_capability, unknown),
        "amx_tile": _fact("amx_tile", torch.cpu._is_amx_tile_supported, unknown),
        "avx512_bf16": _fact("avx512_bf16", torch.cpu._is_avx512_bf16_supported, unknown),
        "zen_cpu": _fact("zen_cpu", current_platform.is_zen_cpu, unknown),
    }
    return found | ({"unknown": unknown} if unknown else {})


def _config(command: list[str]) -> dict[str, Any]:
    """The configuration ``vllm.entrypoints.openai.api_server`` builds from ``command``."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(command)
    config = AsyncEngineArgs.from_cli_args(parsed).create_engine_config(UsageContext.OPENAI_API_SERVER)
    unknown: dict[str, str] = {}
    scheduler, cache, compilation = config.scheduler_config, config.cache_config, config.compilation_config
    found = {
        "dtype": str(config.model_config.dtype),
        "max_model_len": config.model_config.max_model_len,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_seqs": scheduler.max_num_seqs,
        "enable_chunked_prefill": scheduler.enable_chunked_prefill,
        "async_scheduling": scheduler.async_scheduling,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "block_size": cache.block_size,
        "kv_cache_dtype": cache.cache_dtype,
        "worker": config.parallel_config.worker_cls,
        "executor": config.parallel_config.distributed_executor_backend,
        "v2_model_runner": _fact("v2_model_runner", lambda: config.use_v2_model_runner, unknown),
        "attention_backend": _fact("attention_backend", lambda: _attention_backend(config), unknown),
        "linear_kernel": _fact("linear_kernel", lambda: _linear_kernel(config), unknown),
        "enforce_eager": config.model_config.enforce_eager,
        "compilation": {
            "mode": getattr(compilation.mode, "name", compilation.mode),
            "backend": compilation.backend,
            "cudagraph_mode": getattr(compilation.cudagraph_mode, "name", compilation.cudagraph_mode),
            "cudagraph_capture_sizes": compilation.cudagraph_capture_sizes,
            "custom_ops": compilation.custom_ops,
        },
        "speculative": _fact("speculative", lambda: _speculative(config.speculative_config), unknown),
    }
    return found | ({"unknown": unknown} if unknown else {})


def _attention_backend(config: Any) -> str:
    """The backend vLLM's selector picks for the model's layers under ``config``."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    model = config.model_config
    with set_current_vllm_config(config):
        backend = get_attn_backend(model.get_head_size(), model.dtype, config.cache_config.cache_dtype)
    return str(backend.get_name())


def _linear_kernel(config: Any) -> str:
    """The GEMM vLLM's CPU dispatch (``dispatch_cpu_unquantized_gemm``, which logs its choice
    only at debug level) picks for a square weight of the model's width: its checks, in its
    order."""
    import torch
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.utils import check_cpu_sgl_kernel
    from vllm.platforms import current_platform

    width, dtype = config.model_config.get_hidden_size(), config.model_config.dtype
    if current_platform.is_zen_cpu() and hasattr(torch.ops.zentorch, "zentorch_linear_unary"):
        return "zentorch_linear_unary"
    if check_cpu_sgl_kernel(width, width, dtype):
        return "sgl weight_packed_linear"
    if ops._supports_onednn:
        return "oneDNN onednn_mm"
    return "torch.nn.functional.linear"


def _speculative(spec: Any) -> dict[str, Any] | None:
    """The method's own settings (an ``ngram`` config also carries suffix defaults: left out)."""
    if spec is None:
        return None
    own = {"ngram": "prompt_lookup_", "suffix": "suffix_decoding_"}.get(spec.method, "")
    keys = ["method", "num_speculative_tokens"]
    keys += [key for key in vars(spec) if own and key.startswith(own)]
    return {key: getattr(spec, key) for key in keys if hasattr(spec, key)}


if __name__ == "__main__":
    sys.exit(main())
