"""How a model is loaded: `LoadOptions`, the one value every front end builds (the engine, the
pipeline, the command line, a Ray replica, both adapters) and `LookaheadEngine.from_pretrained`
reads (``from_pretrained(load=options)``; this module does not know the engine).

Plain values only (strings, booleans, dicts of what you pass on to transformers), so that the
options travel as they are to another process (every Ray replica loads its own copy), and are
checked when made, before a long load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict

from rag_lookahead.models import check_loading_options, check_placement, device_name

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack


__all__ = ["LoadKeywords", "LoadOptions"]


@dataclass(frozen=True)
class LoadOptions:
    """A model to load offline, and how (see `rag_lookahead.models.load_model`).

    Attributes:
        model: ``None`` (the default SmolLM2-135M-Instruct), a built-in model's name
            (``"gemma3-270m"``), a local directory or a hub id already in the local cache.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` ... (a `torch.device` is kept
            as its name); ``None``: the CPU, unless ``model_kwargs`` places the model. A name
            torch cannot parse (``"tpu"``) is refused when made; one this machine lacks
            (``"cuda:99"``) when loading, before the weights load (a Ray replica loads where
            its GPU is).
        dtype: A torch dtype's name (``"bfloat16"``; a `torch.dtype` is kept as its name) or
            ``"auto"``; ``None``: fp32 on the CPU, the checkpoint's dtype elsewhere.
        trust_remote_code: Run model code shipped with the checkpoint (only if you trust it).
        model_kwargs: More arguments for the model's ``from_pretrained``: ``device_map``,
            ``quantization_config``, ``attn_implementation``, ``revision`` ...
        tokenizer_kwargs: More arguments for the tokenizer's ``from_pretrained``.
        chat_template_kwargs: Variables for the chat template of every chat prompt, e.g.
            ``{"enable_thinking": False}`` for Qwen3.
        progress: Show progress while a built-in model is converted, while the weights load
            and while the costs are measured: bars on standard error when it is a terminal,
            else lines to the ``rag_lookahead.progress`` logger (see `rag_lookahead.progress`).
            Without it nothing is shown, transformers' own bars included.
    """

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    progress: bool = False

    def __post_init__(self) -> None:
        from rag_lookahead.prompts import check_chat_template_kwargs

        _optional_text("model", self.model)
        device = device_name(self.device)
        model_kwargs, tokenizer_kwargs = check_loading_options(self.model_kwargs, self.tokenizer_kwargs)
        for flag in ("trust_remote_code", "progress"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        check_placement(device, model_kwargs)
        template_kwargs = check_chat_template_kwargs(self.chat_template_kwargs)
        checked = {
            "device": device,
            "dtype": _dtype_name(self.dtype),
            "model_kwargs": model_kwargs,
            "tokenizer_kwargs": tokenizer_kwargs,
            "chat_template_kwargs": template_kwargs,
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # as plain values, whatever was given

    @property
    def on_gpu(self) -> bool:
        """Whether the model runs on a CUDA device (a Ray replica then needs a GPU)."""
        return self.device is not None and self.device.startswith("cuda")

    def given(self) -> list[str]:
        """The names of the options set to other than their defaults, ``model`` included."""
        return [f.name for f in fields(self) if getattr(self, f.name) != _default(f)]

    @classmethod
    def of(
        cls, load: LoadOptions | None, model: str | None = None, **options: Unpack[LoadKeywords]
    ) -> LoadOptions:
        """``load``, or the options given one by one (``None`` or ``False`` being not given),
        but not both: what the functions that take both accept."""
        named: dict[str, Any] = {"model": model, **options}
        given = {name: value for name, value in named.items() if value is not None and value is not False}
        if load is None:
            return cls(**given)
        if not isinstance(load, LoadOptions):
            raise TypeError(f"load must be LoadOptions, got {type(load).__name__}")
        if given:
            raise ValueError(f"pass the loading options either as load= or one by one ({', '.join(given)})")
        return load


class LoadKeywords(TypedDict, total=False):
    """`LoadOptions` besides the model, as the keyword arguments of a function that takes them
    one by one (``LookaheadEngine.from_pretrained(path, dtype="bfloat16")``)."""

    device: str | torch.device | None
    dtype: torch.dtype | str | None
    trust_remote_code: bool
    model_kwargs: Mapping[str, Any] | None
    tokenizer_kwargs: Mapping[str, Any] | None
    chat_template_kwargs: Mapping[str, Any] | None
    progress: bool


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _optional_text(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")


def _dtype_name(value: torch.dtype | str | None) -> str | None:
    """A dtype as its name, checked: ``torch.bfloat16`` and ``"bfloat16"`` are ``"bfloat16"``."""
    if value is None or value == "auto":
        return value
    import torch

    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    named = getattr(torch, value, None) if isinstance(value, str) and value.isidentifier() else None
    if not isinstance(named, torch.dtype):
        raise ValueError(
            f"dtype must be a torch dtype or its name (e.g. 'bfloat16') or 'auto', got {value!r}"
        )
    return value
