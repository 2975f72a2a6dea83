"""Tiny in-process models and tokenizers for tests: the core's and both integrations' suites.

Random weights give gibberish, but deterministic gibberish, which is all losslessness tests
need: the same tokens with lookahead on and off. Nothing here downloads anything.
"""

from __future__ import annotations

import importlib.util
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
)

from rag_lookahead.config import GenerationParams, LookaheadConfig, Mode
from rag_lookahead.decoding.constraint import to_lark
from rag_lookahead.decoding.tree import DraftTree, StepDraft, TreeInputs
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.streaming.stream import Completion, TextStream
from rag_lookahead.structured.grammar import Grammar

__all__ = [
    "ASCII_VOCAB",
    "BYTE_VOCAB",
    "EXAMPLES",
    "FAMILIES",
    "SLIDING_FAMILIES",
    "SLIDING_WINDOW",
    "SMALL_SCHEMA",
    "VOCAB",
    "AsciiTokenizer",
    "CharTokenizer",
    "ascii_fast_tokenizer",
    "byte_fast_tokenizer",
    "grammar_accepts",
    "greedy_reference",
    "load_example",
    "nested_person",
    "packaged_template",
    "random_tree",
    "read_all",
    "read_past_deadline",
    "row_by_row_ancestors",
    "row_by_row_inputs",
    "run_together",
    "save_tiny_model",
    "sliding_config",
    "sliding_model",
    "small_grammars",
    "tiny_config",
    "tiny_engine",
    "tiny_model",
    "tiny_tool_engine",
    "weather_tool",
]

VOCAB = 96
ASCII_VOCAB = 95  # token i is chr(32 + i): space to "~"
FAMILIES = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt2")


def _tiny_settings(vocab: int, layers: int, **extra: Any) -> dict[str, Any]:
    """The config arguments every tiny model shares: small, no special tokens."""
    return {
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": 0,
        **extra,
    }


def tiny_config(family: str, vocab: int = VOCAB, **extra: Any) -> Any:
    """A two-layer config of ``family`` with a ``vocab``-token vocabulary and no special tokens."""
    common = _tiny_settings(vocab, 2, **extra)
    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=512,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )
    configs: dict[str, Any] = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": lambda **kw: MistralConfig(**{"sliding_window": None, **kw}),
        "gemma": lambda **kw: GemmaConfig(head_dim=8, **kw),
        "phi3": Phi3Config,
    }
    return configs[family](**common)


# Families whose layers attend over a sliding window (all of them, or mixed with full layers).
SLIDING_FAMILIES = ("gemma3", "gemma2", "mistral", "cohere2", "gpt_oss", "qwen2")
SLIDING_WINDOW = 8


def sliding_config(family: str, vocab: int = VOCAB, window: int = SLIDING_WINDOW) -> Any:
    """A four-layer config of ``family`` with sliding-window layers of ``window`` tokens."""
    import transformers

    common = _tiny_settings(vocab, 4, sliding_window=window)
    mixed = ["sliding_attention", "full_attention"] * 2
    configs: dict[str, Any] = {
        "gemma3": lambda: transformers.Gemma3TextConfig(
            head_dim=8, layer_types=[*["sliding_attention"] * 3, "full_attention"], **common
        ),
        "gemma2": lambda: transformers.Gemma2Config(head_dim=8, **common),
        "mistral": lambda: transformers.MistralConfig(**common),  # every layer slides
        "cohere2": lambda: transformers.Cohere2Config(layer_types=mixed, **common),
        "gpt_oss": lambda: transformers.GptOssConfig(
            head_dim=8, num_local_experts=2, num_experts_per_tok=1, layer_types=mixed, **common
        ),
        "qwen2": lambda: transformers.Qwen2Config(use_sliding_window=True, max_window_layers=2, **common),
    }
    return configs[family]()


@cache
def sliding_model(family: str, seed: int = 0, vocab: int = VOCAB) -> Any:
    """A random-weight model of ``family`` with sliding-window layers (read-only, cached)."""
    torch.manual_seed(seed)
    return _sharpened(AutoModelForCausalLM.from_config(sliding_config(family, vocab)).eval())


@cache
def tiny_model(family: str = "llama", seed: int = 0, vocab: int = VOCAB) -> Any:
    """A random-weight model of ``family`` (cached: treat it as read-only)."""
    torch.manual_seed(seed)
    return _sharpened(AutoModelForCausalLM.from_config(tiny_config(family, vocab)).eval())


def _sharpened(model: Any) -> Any:
    # Random init gives near-uniform logits; sharpen them so greedy paths repeat like real text.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class _Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.input_ids = ids


class CharTokenizer:
    """Token i is the single character ``chr(0x4E00 + i)``; no special tokens, no chat template."""

    eos_token_id = None
    chat_template: str | None = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(0x4E00 + int(i)) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 0x4E00 for c in text]

    def __call__(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        return _Encoding(self.encode(text))


class AsciiTokenizer(CharTokenizer):
    """One printable ASCII character per token, and a one-line-per-message chat template."""

    chat_template = "role: content | "  # any truthy template; `apply_chat_template` renders it

    def encode(self, text: str) -> list[int]:
        return [min(max(ord(c) - 32, 0), ASCII_VOCAB - 1) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + int(i)) for i in ids)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True, **_: Any
    ) -> dict[str, list[int]]:
        text = "".join(f"{m['role']}: {m['content']} | " for m in messages)
        if add_generation_prompt:
            text += "assistant: "
        return {"input_ids": self.encode(text)}


def tiny_engine(mode: Mode = "trie") -> LookaheadEngine:
    """A fresh engine (its own trie) over the tiny Llama with the ASCII tokenizer."""
    model = tiny_model("llama", 0, ASCII_VOCAB)
    return LookaheadEngine(model, AsciiTokenizer(), LookaheadConfig(mode=mode, min_query_length=1))


def greedy_reference(model: Any, prompt: Sequence[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
    """Plain `model.generate` greedy continuation (new tokens only)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **kwargs,
        )
    return list(out[0, len(prompt) :].tolist())


def run_together(
    engine: LookaheadEngine, jobs: list[tuple[list[int], GenerationParams]], stagger: int
) -> list[Completion]:
    """Start the calls one after another, each once the previous has released ``stagger``
    chunks, then read them all (in threads): they join and leave the batch at many steps."""
    streams: list[TextStream] = []
    for prompt, params in jobs:
        streams.append(engine.stream(prompt, params))
        for _ in range(stagger):
            next(streams[-1].chunks(), None)
    results = read_all(streams)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]
    return [r for r in results if not isinstance(r, Exception)]


def read_all(streams: Sequence[TextStream]) -> list[Completion | Exception]:
    """Each of ``streams`` read to its end in a thread of its own (the calls decode as one
    batch meanwhile): its completion, or what reading it raised."""
    results: list[Completion | Exception] = [Exception("not read")] * len(streams)

    def finish(i: int) -> None:
        try:
            results[i] = streams[i].complete()
        except Exception as err:
            results[i] = err

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(len(streams))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# Renders `enable_thinking=False` as Qwen3's template does in spirit: a marker in the prompt.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} | {% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def ascii_fast_tokenizer(chat_template: str = TINY_CHAT_TEMPLATE) -> Any:
    """A Hugging Face fast tokenizer of one printable ASCII character per token, then
    ``<eos>`` (id `ASCII_VOCAB`), with ``chat_template``: what libraries that read a real
    tokenizer's vocabulary (grammar libraries) need, at the tiny models' size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE without merges: text splits into characters, written in GPT-2's byte
    # alphabet (where printable ASCII is itself and the space is "Ġ"), as real vocabularies are.
    vocab = {("Ġ" if i == 0 else chr(32 + i)): i for i in range(ASCII_VOCAB)} | {"<eos>": ASCII_VOCAB}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", chat_template=chat_template)


BYTE_VOCAB = 256  # token i is byte i


def byte_fast_tokenizer(chat_template: str = TINY_CHAT_TEMPLATE) -> Any:
    """A Hugging Face fast tokenizer of one byte per token, then ``<eos>`` (id `BYTE_VOCAB`),
    with ``chat_template``: unlike `ascii_fast_tokenizer`, it writes new lines, which the
    tool-call formats' markers hold."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's byte alphabet, as byte-level vocabularies write bytes: the printable ones as
    # themselves, the others as the characters from U+0100 on, in order.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    characters = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    vocab = {characters[b]: b for b in range(BYTE_VOCAB)} | {"<eos>": BYTE_VOCAB}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", chat_template=chat_template)


def nested_person() -> Any:
    """A pydantic model nesting another, as LangChain's and LlamaIndex's tools carry it: an
    ``Address`` (written once, in ``$defs``, and referred to), a list of them, an optional one.
    Closed and short, so that a tiny random model under its grammar ends a call in few tokens.
    For the nested-schema tests of all three suites; needs pydantic."""
    from pydantic import BaseModel, ConfigDict, Field

    class Address(BaseModel):
        model_config = ConfigDict(extra="forbid")
        street: str = Field(max_length=4)
        city: str = Field(max_length=4)

    class Person(BaseModel):
        """A person to save."""

        model_config = ConfigDict(extra="forbid")
        name: str = Field(max_length=4)
        address: Address
        previous: list[Address] = Field(default=[], max_length=2)
        billing: Address | None = None

    return Person


def weather_tool(city: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAI-style ``get_weather`` tool whose one argument, ``city``, has the schema
    ``city`` (default: any string)."""
    properties = {"city": dict(city or {"type": "string"})}
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": properties, "required": ["city"]},
        },
    }


def packaged_template(name: str = "smollm2-tools.jinja") -> str:
    """A chat template shipped in ``rag_lookahead/data/chat_templates`` (the default model's
    tool-capable one by default)."""
    return (resources.files("rag_lookahead") / "data" / "chat_templates" / name).read_text(encoding="utf-8")


def tiny_tool_engine(chat_template: str, mode: Mode = "trie") -> LookaheadEngine:
    """A fresh engine over the tiny Llama with `byte_fast_tokenizer` and ``chat_template`` (one
    that renders tools: forced calls then decode under the tool format's grammar)."""
    tokenizer = byte_fast_tokenizer(chat_template)
    return LookaheadEngine(_tool_model(), tokenizer, LookaheadConfig(mode=mode, min_query_length=1))


@cache
def _tool_model() -> Any:
    # One byte a token: a prompt with tools in it runs to thousands of tokens.
    torch.manual_seed(0)
    config = tiny_config("llama", BYTE_VOCAB + 1, max_position_embeddings=8192)
    return _sharpened(AutoModelForCausalLM.from_config(config).eval())


# A JSON schema that a tiny random model fills in few tokens under its grammar.
SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "string", "maxLength": 5},
        "b": {"enum": ["xy", "zw"]},
        "c": {"type": "integer"},
    },
    "required": ["a", "b", "c"],
}


def small_grammars() -> dict[str, Grammar]:
    """One grammar of each kind constrained decoding is tested under: `SMALL_SCHEMA`'s, a
    regex's, and a tool call's (tags around that schema or any JSON)."""
    return {
        "schema": Grammar.json_schema(SMALL_SCHEMA),
        "regex": Grammar.regex(r"[a-f]{2,6}( [a-f]{2,6}){0,3}\."),
        "tool call": Grammar.sequence(
            Grammar.literal("<call>"),
            Grammar.choice(Grammar.json_schema(SMALL_SCHEMA), Grammar.json()),
            Grammar.literal("</call>"),
        ),
    }


def grammar_accepts(grammar: Grammar, text: str) -> bool:
    """Whether ``text`` is a whole answer under ``grammar`` (read a byte a token by llguidance,
    as constrained decoding reads it); a grammar llguidance refuses is a `ValueError`."""
    import llguidance

    matcher = llguidance.LLMatcher(_byte_view(), to_lark(grammar))
    if matcher.is_error():
        raise ValueError(f"the grammar cannot be used: {matcher.get_error()}")
    tokens = list(text.encode("utf-8"))
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


@cache
def _byte_view() -> Any:
    import llguidance.hf

    return llguidance.hf.from_tokenizer(byte_fast_tokenizer(), n_vocab=BYTE_VOCAB + 1, eos_token=[BYTE_VOCAB])


# The repository's examples, next to this package in a checkout.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(script: str) -> ModuleType:
    """The example ``examples/<script>``, imported as a module of its own (its ``main`` not run)."""
    path = EXAMPLES / script
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None, f"{path} is missing"
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def save_tiny_model(directory: Path, family: str = "llama") -> Path:
    """The tiny model of ``family`` and `ascii_fast_tokenizer`, saved as a model directory
    that ``from_pretrained`` loads (offline)."""
    tokenizer = ascii_fast_tokenizer()
    model = tiny_model(family, 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def read_past_deadline(items: Iterator[Any], seconds: float) -> list[Any]:
    """Read the first of a call's ``items``, leave the rest unread past ``seconds`` (an unread
    stream does not advance, so the call cannot end first), then read them: a call with that
    deadline raises `TimeoutError` here."""
    next(items)
    time.sleep(seconds + 0.5)
    return list(items)


# The step inputs as they were built before `rag_lookahead.decoding.masks`, row by row and node
# by node: the reference the vectorised build is tested (and timed) against.


def row_by_row_ancestors(tree: DraftTree) -> torch.Tensor:
    """The ancestor mask as it was built: each node's path walked in Python."""
    mask = torch.zeros(len(tree), len(tree), dtype=torch.bool)
    for i in range(len(tree)):
        mask[i, tree.path(i)] = True
    return mask


def _row_by_row_layout(draft: StepDraft) -> tuple[list[int], list[int], torch.Tensor]:
    tree, side = draft.tree, draft.side
    n = len(tree)
    allowed = torch.zeros(len(draft), len(draft), dtype=torch.bool)
    allowed[:n, :n] = row_by_row_ancestors(tree)
    offsets, tokens = list(tree.depths), list(tree.tokens)
    if side is not None:
        allowed[n:, 0] = True
        for row, seen in enumerate(side.visible):
            allowed[n + row, [n + k for k in seen]] = True
        offsets += side.offsets
        tokens += side.tokens
    return tokens, offsets, allowed


def row_by_row_inputs(drafts: Sequence[StepDraft], lengths: Sequence[int], dtype: torch.dtype) -> TreeInputs:
    """The batch's inputs as they were built before: one row at a time."""
    rows, width = len(drafts), max(len(d) for d in drafts)
    mask = torch.full((rows, 1, width, max(lengths) + width), torch.finfo(dtype).min, dtype=dtype)
    ids = torch.zeros(rows, width, dtype=torch.long)
    positions = torch.zeros(rows, width, dtype=torch.long)
    for i, (draft, length) in enumerate(zip(drafts, lengths, strict=True)):
        tokens, offsets, allowed = _row_by_row_layout(draft)
        n = len(tokens)
        seen = torch.eye(width, dtype=torch.bool)
        seen[:n, :n] = allowed
        mask[i, 0, :, length : length + width].masked_fill_(seen, 0.0)
        mask[i, 0, :n, :length] = 0.0
        ids[i, :n] = torch.tensor(tokens)
        ids[i, n:] = tokens[0]
        positions[i, :n] = torch.tensor(offsets) + length
        positions[i, n:] = length
    return TreeInputs(ids, positions, mask)


def random_tree(rng: random.Random, size: int) -> DraftTree:
    """A tree of ``size`` nodes with distinct tokens below 1,000: chains and bushes alike (a
    parent drawn near the node or anywhere before it)."""
    parents = [-1] + [
        max(0, i - 1 - rng.randrange(3)) if rng.random() < 0.6 else rng.randrange(i) for i in range(1, size)
    ]
    return DraftTree(tuple(rng.sample(range(1000), size)), tuple(parents))
