"""Frozen, validated configuration: how to draft (`LookaheadConfig`) and how to pick tokens
(`GenerationParams`).

Each drafting setting has a lifetime (`lifetime_of`): per call, or per engine, fixed by what the
engine built from it. An engine's variants differ in per-call settings only (`check_variant`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, Literal

from rag_lookahead.streaming.logprobs import MAX_TOP_LOGPROBS
from rag_lookahead.structured.grammar import Grammar

__all__ = [
    "CpuLinear",
    "DraftPolicy",
    "GenerationParams",
    "Lifetime",
    "LookaheadConfig",
    "Mode",
    "StepChoice",
    "check_variant",
    "is_greedy",
    "keyword_arguments",
    "lifetime_of",
    "settings_of",
]

Mode = Literal["auto", "trie", "jacobi", "off"]
DraftPolicy = Literal["trie", "suffix"]
CpuLinear = Literal["auto", "onednn", "reordered", "torch"]
StepChoice = Literal["auto", "eager", "static", "captured"]
Lifetime = Literal["call", "engine"]

# Each field's lifetime, and for a per-engine one what the engine built from it: the words of
# the error that refuses a variant changing it (`check_variant`).
_CALL = {"lifetime": "call", "held_by": "read by each call as it starts"}
_TRIE = {"lifetime": "engine", "held_by": "the shape of the engine's trie"}
_BATCHES = {"lifetime": "engine", "held_by": "the engine's scheduler: its batches and prefix cache"}
_FORWARDS = {"lifetime": "engine", "held_by": "the engine's runner: its forwards and their measured costs"}


# Far beyond any real trie, and small enough that a hostile file cannot make the cap meaningless.
MAX_TRIE_NODES = 1_000_000_000
MAX_PREFIX_CACHE_MB = 1 << 30  # a petabyte: only there to refuse absurd values


def _positive(name: str, value: object, most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be at most {most}, got {value}")


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LookaheadConfig:
    """Drafting settings, named as PIA names them, in two lifetimes (`lifetime_of`).

    - **Per call**: ``mode``, ``decoding_length``, ``min_query_length``, ``window_size``,
      ``ngram_size``, ``guess_set_size``, ``draft_policy``. Each call reads them as it starts:
      an engine's variants (`LookaheadEngine.with_config`, `LookaheadEngine.plain`) may differ
      in them, and share the engine's model, trie, batches and costs.
    - **Per engine**: fixed once the engine is built, held by what it built from them: the
      trie (``max_query_length``, ``branch_length``, ``max_trie_nodes``), the scheduler's
      batches and prefix cache (``max_batch_size``, ``max_tokens_per_forward``,
      ``max_prefill_tokens_per_step``, ``prefix_cache_mb``), the runner's forwards
      (``cpu_linear``, ``direct_forward``). A variant that changes one is refused, naming it
      (`check_variant`): another value needs another engine.

    What outlives an engine is no field here: torch's thread count (the CLI's ``--threads``),
    the thread forwards run in (`ModelThread`), and the disk caches of kernel choices, costs
    and acceptance (the engine's ``cache_dir``) are set where they are made.

    Attributes:
        mode: ``"trie"`` verifies up to ``decoding_length`` trie draft tokens per step;
            ``"auto"`` verifies only as much of each draft as is expected to pay for its wider
            forward on this hardware (a measured cost curve and learned acceptance rates);
            ``"jacobi"`` drafts n-grams from a Jacobi lookahead window (LADE) every step;
            ``"off"`` is plain decoding. In ``"auto"`` the Jacobi pool's n-grams compete with
            the trie's nodes, and the window runs only when the forward's cost barely grows.
        decoding_length: Most draft tokens verified in one forward (the tree size, root excluded).
        branch_length: Deepest draft branch, in tokens.
        max_query_length: Longest suffix of the context matched in the trie.
        min_query_length: Shortest suffix match that may draft. In ``"auto"`` mode one token is
            fine: what each match length gets accepted is learned and weighed against the cost.
            With ``"trie"`` a 2-token minimum avoids one-token coincidences, whose drafts are
            rarely accepted but always paid for.
        max_trie_nodes: Hard cap on trie nodes; least frequent nodes are pruned above it.
        window_size: Columns W of the Jacobi window (LADE's WINDOW_SIZE).
        ngram_size: N, the length of the window's n-grams (LADE's LEVEL).
        guess_set_size: G, most n-grams kept per first token in the pool (LADE's GUESS_SET_SIZE).
        max_batch_size: Most calls decoding together in one forward; more wait their turn.
            ``1`` answers one call at a time, in arrival order.
        max_tokens_per_forward: Most tokens one forward takes: all rows' drafts (and joining
            prompts' chunks riding along) together in a decoding step, or one chunk of a
            joining call's prompt forwarded apart while others run. While none runs, a long
            prompt goes in chunks of a multiple of it, the smallest that cost the prompt at most
            a twentieth more by the measured costs (on a CPU; where a forward's cost hardly
            grows with its tokens, as on a GPU, all of it), so that calls arriving meanwhile
            start between them.
        max_prefill_tokens_per_step: Most prompt tokens a step of the running calls takes in:
            first the chunks riding in its rows, then chunks forwarded apart, between two
            steps, of up to ``max_tokens_per_forward`` (a chunk is begun while fewer were
            spent, so at least one goes each step none rides in), the prompt with the
            least left first (less what went to others while it waited): prompts arriving
            together all start within a few steps rather than one chunk a step, short ones
            first, while the running calls wait once for what a step lets in.
            vLLM's OpenAI server on a CPU takes 2048 tokens a step by default
            (``max_num_batched_tokens``). Fewer keeps running calls' tokens evenly spaced;
            more starts joining calls sooner.
        draft_policy: What ``"auto"`` and ``"trie"`` draft from: ``"suffix"``, first the
            call's own text (prompt, documents, output so far), each earlier occurrence of the
            context's end drafting a branch as deep and weighing as much as its match is long
            (SuffixDecoding's rule), then the shared trie's branches in the room left;
            ``"trie"``, the trie's best branches after the longest match of up to
            ``max_query_length`` tokens only.
        prefix_cache_mb: Memory for the KV entries of past prompts, which a prompt sharing
            their beginning (a system prompt, a repeated question) reuses instead of
            prefilling it again; ``0`` turns the reuse off.
        cpu_linear: The kernel of the engine's fp32 linear layers on a CPU: ``"onednn"``
            (oneDNN's, much cheaper for the few rows a decoding step has on some CPUs, see
            `rag_lookahead.runtime.kernels`), ``"reordered"`` (oneDNN's over a copy of the
            weights reordered once into its own layout: cheaper still, for a second copy of
            the linear weights in memory), ``"torch"`` (torch's default, as ``generate``
            runs, faster on others), or ``"auto"``: whichever runs this model's linear layers
            fastest on this machine for a forward of so many tokens, timed when the engine is
            built (``"reordered"`` only where its copy takes at most a quarter of the memory).
            They agree up to rounding. Read once, by the engine built with it
            (`LookaheadEngine.backend` says what was chosen). ``"packed"``, its earlier name,
            is read as ``"reordered"`` with a `DeprecationWarning`.
        direct_forward: Run the forwards of a model whose layers are Llama's (Llama, Mistral,
            Qwen2 without sliding windows) by their operators, without their modules' calls
            (`rag_lookahead.runtime.direct`), where that gives the model's own logits bit for
            bit on probe inputs (checked when the engine is built); ``False`` always calls the
            model. Read once, by the engine built with it.
        step: How the batch's steps run (`rag_lookahead.runtime.static`): ``"eager"``, over
            caches that grow with each call; ``"static"``, padded to a few fixed shapes over
            preallocated slots of ``max_model_len`` columns; ``"captured"``, those shapes
            captured once as CUDA graphs when the engine is built, and replayed; ``"auto"``,
            eager for now (it is to capture on CUDA devices once a GPU run has measured the
            captured step: `rag_lookahead.tuning.step_choice`). Where the step named cannot
            run (a hook a replay would skip, an attention without tree masks, not a CUDA
            device), the engine says why once and runs eager: outputs are the same either way.
            Read once, by the engine built with it (`LookaheadEngine.backend` says what runs).
        max_model_len: Most tokens of one call in a static or captured step's slots: its
            prompt, its ``max_new_tokens`` and the widest draft (cut to the model's positions).
            A call longer than that decodes plainly, alone, over its own growing cache, and its
            stats say so. Every slot holds this many columns of every layer's keys and values,
            and a step's attention reads all of them. Read once, by the engine built with it.
    """

    mode: Mode = field(default="auto", metadata=_CALL)
    decoding_length: int = field(default=16, metadata=_CALL)
    branch_length: int = field(default=12, metadata=_TRIE)
    max_query_length: int = field(default=3, metadata=_TRIE)
    min_query_length: int = field(default=1, metadata=_CALL)
    max_trie_nodes: int = field(default=200_000, metadata=_TRIE)
    window_size: int = field(default=4, metadata=_CALL)
    ngram_size: int = field(default=4, metadata=_CALL)
    guess_set_size: int = field(default=4, metadata=_CALL)
    max_batch_size: int = field(default=8, metadata=_BATCHES)
    max_tokens_per_forward: int = field(default=256, metadata=_BATCHES)
    max_prefill_tokens_per_step: int = field(default=2048, metadata=_BATCHES)
    prefix_cache_mb: int = field(default=256, metadata=_BATCHES)
    draft_policy: DraftPolicy = field(default="suffix", metadata=_CALL)
    cpu_linear: CpuLinear = field(default="auto", metadata=_FORWARDS)
    direct_forward: bool = field(default=True, metadata=_FORWARDS)
    step: StepChoice = field(default="auto", metadata=_FORWARDS)
    max_model_len: int = field(default=4096, metadata=_FORWARDS)

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "trie", "jacobi", "off"):
            raise ValueError(f"mode must be 'auto', 'trie', 'jacobi' or 'off', got {self.mode!r}")
        for name in (
            "decoding_length",
            "branch_length",
            "max_query_length",
            "min_query_length",
            "window_size",
            "ngram_size",
            "guess_set_size",
            "max_batch_size",
            "max_tokens_per_forward",
            "max_prefill_tokens_per_step",
        ):
            _positive(name, getattr(self, name))
        if self.draft_policy not in ("trie", "suffix"):
            raise ValueError(f"draft_policy must be 'trie' or 'suffix', got {self.draft_policy!r}")
        if self.cpu_linear == "packed":  # (its name before "packed" came to mean batch rows only)
            warnings.warn(
                'cpu_linear="packed" is now called "reordered" (oneDNN over reordered weights)',
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "cpu_linear", "reordered")
        if self.cpu_linear not in ("auto", "onednn", "reordered", "torch"):
            raise ValueError(
                f"cpu_linear must be 'auto', 'onednn', 'reordered' or 'torch', got {self.cpu_linear!r}"
            )
        if self.step not in ("auto", "eager", "static", "captured"):
            raise ValueError(f"step must be 'auto', 'eager', 'static' or 'captured', got {self.step!r}")
        _positive("max_model_len", self.max_model_len)
        if not isinstance(self.direct_forward, bool):
            raise ValueError(f"direct_forward must be True or False, got {self.direct_forward!r}")
        if self.ngram_size < 2:
            raise ValueError(f"ngram_size must be at least 2, got {self.ngram_size}")
        if self.mode in ("auto", "jacobi") and self.ngram_size - 1 > self.decoding_length:
            raise ValueError(
                f"a Jacobi candidate has ngram_size - 1 = {self.ngram_size - 1} tokens, more than "
                f"decoding_length ({self.decoding_length}) lets one step verify"
            )
        if self.min_query_length > self.max_query_length:
            raise ValueError(
                f"min_query_length ({self.min_query_length}) must not exceed "
                f"max_query_length ({self.max_query_length})"
            )
        if self.max_tokens_per_forward < self.max_batch_size:
            raise ValueError(
                f"max_tokens_per_forward ({self.max_tokens_per_forward}) must allow one token per "
                f"row of a full batch (max_batch_size = {self.max_batch_size})"
            )
        if isinstance(self.prefix_cache_mb, bool) or not isinstance(self.prefix_cache_mb, int):
            raise ValueError(f"prefix_cache_mb must be an integer, got {self.prefix_cache_mb!r}")
        if not 0 <= self.prefix_cache_mb <= MAX_PREFIX_CACHE_MB:
            raise ValueError(
                f"prefix_cache_mb must be from 0 to {MAX_PREFIX_CACHE_MB}, got {self.prefix_cache_mb}"
            )
        _positive("max_trie_nodes", self.max_trie_nodes, MAX_TRIE_NODES)
        if self.max_trie_nodes < 1000:
            raise ValueError(f"max_trie_nodes must be at least 1000, got {self.max_trie_nodes}")


def lifetime_of(name: str) -> Lifetime:
    """How long the `LookaheadConfig` setting ``name`` holds: ``"call"`` (each call reads it,
    an engine's variants may differ in it) or ``"engine"`` (fixed once the engine is built)."""
    lifetime: Lifetime = _field(name).metadata["lifetime"]
    return lifetime


def settings_of(lifetime: Lifetime) -> tuple[str, ...]:
    """The `LookaheadConfig` settings of ``lifetime``, in the order of its fields."""
    if lifetime not in ("call", "engine"):
        raise ValueError(f"lifetime must be 'call' or 'engine', got {lifetime!r}")
    return tuple(f.name for f in fields(LookaheadConfig) if f.metadata["lifetime"] == lifetime)


def check_variant(current: LookaheadConfig, config: LookaheadConfig) -> LookaheadConfig:
    """``config``, for a variant of the engine built with ``current``: refused (`ValueError`,
    naming each one) where it changes a per-engine setting, which the variant would not
    apply, sharing the engine's trie, batches and runner."""
    if not isinstance(config, LookaheadConfig):
        raise TypeError(f"config must be a LookaheadConfig, got {type(config).__name__}")
    changed = [
        f"{f.name} is set per engine ({f.metadata['held_by']}): the engine's is "
        f"{getattr(current, f.name)!r}, this config's {getattr(config, f.name)!r}"
        for f in fields(LookaheadConfig)
        if f.metadata["lifetime"] == "engine" and getattr(config, f.name) != getattr(current, f.name)
    ]
    if changed:
        raise ValueError(
            "; ".join(changed) + ". An engine's variant changes only its per-call settings "
            f"({', '.join(settings_of('call'))}): build another LookaheadEngine for the others, "
            "or derive the config from the engine's own, dataclasses.replace(engine.config, mode=...)"
        )
    return config


def _field(name: str) -> Field[Any]:
    for f in fields(LookaheadConfig):
        if f.name == name:
            return f
    raise ValueError(f"no LookaheadConfig setting is called {name!r}")


@dataclass(frozen=True)
class GenerationParams:
    """How each token is chosen and when generation stops (the common `model.generate` knobs).

    ``None`` for ``eos_token_id`` means the model's own end-of-sequence token(s).
    ``temperature=0`` means greedy, whatever ``do_sample`` says (see `sampling`). A ``seed``
    makes sampling repeat exactly, with lookahead or without (see `TokenChooser`). A
    ``grammar`` constrains every token to those that keep the text within it (see `Grammar`).
    ``logprobs=True`` reports each new token's log probability under the model's raw
    distribution, and ``top_logprobs`` (0 to 20) the most likely tokens at each position (see
    `rag_lookahead.streaming.logprobs`); nothing is computed for them otherwise.
    ``logit_bias`` (OpenAI's): a mapping of token ids to biases from -100 to 100, each added
    to its token's logit at every position, greedy or sampling, before the repetition penalty
    and the sampling warpers (kept as ``(id, bias)`` pairs in id order); the engine refuses
    ids outside its vocabulary.
    """

    max_new_tokens: int = 256
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos_token_id: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = field(default=())
    seed: int | None = None
    grammar: Grammar | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        # Accept what `model.generate` users pass: an int or a list for ids, a str or a list for stops.
        object.__setattr__(self, "eos_token_id", _token_ids(self.eos_token_id))
        object.__setattr__(self, "stop_strings", _strings("stop_strings", self.stop_strings))
        _positive("max_new_tokens", self.max_new_tokens)
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {self.do_sample!r}")
        if not _real("temperature", self.temperature) >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None:
            _positive("top_k", self.top_k)
        if not 0 < _real("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _real("repetition_penalty", self.repetition_penalty) > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        seed = self.seed
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64
        ):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise TypeError(
                f"grammar must be a rag_lookahead.structured.Grammar, got {type(self.grammar).__name__}"
            )
        _check_logprobs(self.logprobs, self.top_logprobs)
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn: ``do_sample`` at a temperature that is not greedy (`is_greedy`)."""
        return self.do_sample and not is_greedy(self.temperature)

    def with_overrides(self, **overrides: object) -> GenerationParams:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise TypeError(f"unknown generation settings {unknown}; known: {[f.name for f in fields(self)]}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


def is_greedy(temperature: float) -> bool:
    """Whether ``temperature`` means greedy decoding, the lossless path: 0 does, whatever
    ``do_sample`` says, as in the OpenAI API, vLLM, Ollama and llama.cpp."""
    return temperature <= 0


def _check_logprobs(logprobs: object, top_logprobs: object) -> None:
    if not isinstance(logprobs, bool):
        raise ValueError(f"logprobs must be True or False, got {logprobs!r}")
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int):
        raise ValueError(f"top_logprobs must be an integer, got {top_logprobs!r}")
    if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {top_logprobs}")
    if top_logprobs and not logprobs:
        raise ValueError(f"top_logprobs={top_logprobs} needs logprobs=True")


# OpenAI's range: -100 bans a token in effect, 100 all but forces it.
_MAX_LOGIT_BIAS = 100.0


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """A mapping of token ids to biases (or ``(id, bias)`` pairs) as pairs in id order."""
    pairs = value.items() if isinstance(value, Mapping) else value
    if not isinstance(pairs, Iterable) or isinstance(pairs, (str, bytes)):
        raise ValueError(f"logit_bias must map token ids to biases, got {value!r}")
    biases: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"logit_bias must map token ids to biases, got {value!r}")
        token, bias = pair
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias keys must be non-negative token ids, got {token!r}")
        if token in biases:
            raise ValueError(f"logit_bias gives token id {token} twice")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not abs(bias) <= _MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be numbers from -100 to 100, got {bias!r} for {token}")
        biases[token] = float(bias)
    return tuple(sorted(biases.items()))


def _token_ids(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    ids = (value,) if isinstance(value, int) else value
    if not isinstance(ids, Iterable) or isinstance(ids, (str, bytes)):
        raise ValueError(f"eos_token_id must be a token id or a list of them, got {value!r}")
    ids = tuple(ids)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"eos_token_id must hold non-negative token ids, got {value!r}")
    return ids


def _strings(name: str, value: object) -> tuple[str, ...]:
    """One string is one item (as transformers takes ``stop_strings``), not its characters."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Iterable) or isinstance(items, bytes):
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}")
    items = tuple(items)
    if any(not isinstance(s, str) or not s for s in items):
        raise ValueError(f"{name} must be non-empty strings, got {items!r}")
    return items


def keyword_arguments(name: str, value: object, reserved: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments handed on to a library (``model_kwargs`` ...) as a plain dict.

    ``None`` is none; anything but a mapping of argument names is a `TypeError`, and a key of
    ``reserved`` (what rag-lookahead sets itself) a `ValueError` giving ``reserved[key]`` as why.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of keyword arguments, got {type(value).__name__}")
    bad = [k for k in value if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise TypeError(f"{name} keys must be argument names, got {bad!r}")
    taken = sorted(set(value) & set(reserved))
    if taken:
        raise ValueError(f"{name} may not set {taken[0]!r}: {reserved[taken[0]]}")
    return dict(value)
