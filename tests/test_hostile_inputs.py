"""Hostile input, as a user might send it: each case gets a clear error and loses nothing.

The table grows with every case found: a name, what is done, the error expected and the words
its message must hold. After each one the engine still answers, and no call's branches linger.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import contextlib
import hashlib
import importlib
import json
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine, TokenTrie, rag_messages
from rag_lookahead.cli import main
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.planning.acceptance import AcceptanceModel, load_acceptance
from rag_lookahead.planning.planner import StepPlanner
from rag_lookahead.rag import (
    DEFAULT_EMBEDDER,
    ChunkingConfig,
    Document,
    DocumentIndex,
    RagPipeline,
    Skipped,
    chunking,
    load_documents,
    split_document,
    store,
)
from rag_lookahead.rag.documents import printable
from rag_lookahead.rag.embedding import default_embedder_path
from rag_lookahead.rag.keyword import KeywordIndex
from rag_lookahead.structured import Grammar, ToolFormat, ToolFormatName
from rag_lookahead.testing import (
    ASCII_VOCAB,
    VOCAB,
    CharTokenizer,
    ascii_fast_tokenizer,
    grammar_accepts,
    greedy_reference,
    tiny_model,
)
from rag_lookahead.testing.holding import holding
from rag_lookahead.testing.long_texts import InsertWatch

PROMPT = [3, 14, 15, 9, 26]
N = 8


@pytest.fixture
def engine() -> LookaheadEngine:
    return LookaheadEngine(
        tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1)
    )


def complete(**kwargs: Any) -> Callable[[LookaheadEngine], object]:
    prompt = kwargs.pop("prompt", PROMPT)
    return lambda engine: engine.complete(prompt, max_new_tokens=N, **kwargs)


def trie_file(tmp_path: Path, **changes: Any) -> Path:
    payload = {"format": "rag-lookahead-trie", "version": 1, "max_query_length": 2, "branch_length": 4}
    payload |= {"max_nodes": 1000, "nodes": [[5, -1, {"a": 1}]], **changes}
    path = tmp_path / "trie.json"
    path.write_text(json.dumps(payload))
    return path


def closed_scope(engine: LookaheadEngine) -> object:
    scope = engine.scope(["一丁七"])
    scope.close()
    return engine.complete(PROMPT, max_new_tokens=N, scope=scope)


def foreign_scope(engine: LookaheadEngine) -> object:
    other = LookaheadEngine(engine.model, engine.tokenizer, engine.config)
    with other.scope(["一丁七"]) as scope:
        return engine.complete(PROMPT, max_new_tokens=N, scope=scope)


# (case, action on the engine, error, words of its message)
ENGINE_CASES: list[tuple[str, Callable[[LookaheadEngine], object], type[Exception], str]] = [
    ("token id past the vocabulary", complete(prompt=[1, 2, VOCAB + 7]), ValueError, "outside the model's"),
    ("negative token id", complete(prompt=[-1, 2]), ValueError, "outside the model's"),
    ("empty prompt", complete(prompt=""), ValueError, "the prompt is empty"),
    ("prompt of another type", complete(prompt=3.5), TypeError, "a prompt is a str"),
    ("prompt past the context window", complete(prompt=[1] * 600), ValueError, "context window"),
    ("None among the documents", complete(documents=[None]), TypeError, "documents must be strings"),
    ("documents not a list", complete(documents=5), TypeError, "documents must be strings"),
    ("empty stop string", complete(stop_strings=[""]), ValueError, "non-empty strings"),
    ("None among stop strings", complete(stop_strings=["a", None]), ValueError, "non-empty strings"),
    ("seed past 64 bits", complete(do_sample=True, seed=2**70), ValueError, "seed must be an integer"),
    ("negative seed", complete(do_sample=True, seed=-1), ValueError, "seed must be an integer"),
    ("seed True", complete(seed=True), ValueError, "seed must be an integer"),
    ("temperature below 0", complete(temperature=-0.5), ValueError, "temperature must be >= 0"),
    ("temperature a string", complete(temperature="hot"), ValueError, "temperature must be a finite number"),
    ("top_p 0", complete(top_p=0.0), ValueError, "top_p must be in"),
    ("top_p NaN", complete(top_p=float("nan")), ValueError, "top_p must be a finite number"),
    ("top_k 0", complete(top_k=0), ValueError, "top_k must be a positive integer"),
    ("repetition penalty 0", complete(repetition_penalty=0), ValueError, "repetition_penalty must be > 0"),
    (
        "max_new_tokens True",
        lambda e: e.complete(PROMPT, GenerationParams(max_new_tokens=True)),
        ValueError,
        "max_new_tokens must be a positive integer",
    ),
    ("do_sample a string", complete(do_sample="yes"), ValueError, "do_sample must be True or False"),
    ("eos a string", complete(eos_token_id="x"), ValueError, "eos_token_id must be a token id"),
    ("negative eos", complete(eos_token_id=[-3]), ValueError, "non-negative token ids"),
    ("unknown setting", complete(num_beams=4), TypeError, "unknown generation settings ['num_beams']"),
    (
        "top_logprobs -1",
        complete(logprobs=True, top_logprobs=-1),
        ValueError,
        "top_logprobs must be from 0 to 20",
    ),
    (
        "top_logprobs 21",
        complete(logprobs=True, top_logprobs=21),
        ValueError,
        "top_logprobs must be from 0 to 20",
    ),
    (
        "top_logprobs without logprobs",
        complete(top_logprobs=3),
        ValueError,
        "top_logprobs=3 needs logprobs=True",
    ),
    (
        "top_logprobs with logprobs off",
        complete(logprobs=False, top_logprobs=1),
        ValueError,
        "needs logprobs=True",
    ),
    (
        "top_logprobs a float",
        complete(logprobs=True, top_logprobs=2.5),
        ValueError,
        "top_logprobs must be an integer",
    ),
    (
        "top_logprobs True",
        complete(logprobs=True, top_logprobs=True),
        ValueError,
        "top_logprobs must be an integer",
    ),
    ("logprobs an integer", complete(logprobs=5), ValueError, "logprobs must be True or False"),
    ("logprobs a string", complete(logprobs="yes"), ValueError, "logprobs must be True or False"),
    ("logit_bias past the vocabulary", complete(logit_bias={VOCAB: 1}), ValueError, "outside the model's"),
    ("logit_bias of 101", complete(logit_bias={3: 101}), ValueError, "from -100 to 100"),
    ("logit_bias NaN", complete(logit_bias={3: float("nan")}), ValueError, "from -100 to 100"),
    ("logit_bias True", complete(logit_bias={3: True}), ValueError, "from -100 to 100"),
    ("logit_bias keyed by text", complete(logit_bias={"3": 1}), ValueError, "non-negative token ids"),
    ("logit_bias a list of ids", complete(logit_bias=[3, 4]), ValueError, "map token ids to biases"),
    ("closed scope", closed_scope, ValueError, "scope passed to this call is closed"),
    ("another engine's scope", foreign_scope, ValueError, "belongs to another engine"),
    (
        "generate with beams",
        lambda e: e.generate(torch.tensor([PROMPT]), num_beams=4),
        TypeError,
        "num_beams",
    ),
    ("generate on 1-D ids", lambda e: e.generate(torch.tensor(PROMPT)), ValueError, "input_ids must be"),
    ("eos past the vocabulary", complete(eos_token_id=[VOCAB + 4]), ValueError, "outside the model's"),
    (
        "special_tokens_in_content a string",
        lambda e: e.encode(PROMPT, special_tokens_in_content="yes"),
        TypeError,
        "special_tokens_in_content must be True or False",
    ),
    ("generate on a list", lambda e: e.generate([PROMPT]), TypeError, "must be a torch.Tensor"),
    (
        "generate on float ids",
        lambda e: e.generate(torch.tensor([PROMPT]) * 1.0),
        TypeError,
        "integer token ids",
    ),
    (
        "generate on 0 rows",
        lambda e: e.generate(torch.zeros(0, 5, dtype=torch.long)),
        ValueError,
        "non-empty",
    ),
    (
        "generate with a mask of another shape",
        lambda e: e.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, 3, dtype=torch.long)),
        ValueError,
        "attention_mask must have input_ids' shape",
    ),
    (
        "generate with an all-padding row",
        lambda e: e.generate(torch.tensor([PROMPT]), attention_mask=torch.zeros(1, 5, dtype=torch.long)),
        ValueError,
        "a row with no tokens",
    ),
    (
        "generate past max_length",
        lambda e: e.generate(torch.tensor([PROMPT]), max_length=5),
        ValueError,
        "Input length of input_ids is 5, but `max_length` is set to 5",  # transformers' words
    ),
    (
        "generate past the model's max_length",
        lambda e: generate_under(e, {"max_length": 3}),
        ValueError,
        "Input length of input_ids is 5, but `max_length` is set to 3",
    ),
    (
        "generate past the model's window",
        lambda e: e.generate(torch.tensor([PROMPT * 200])),
        ValueError,
        "Input length of input_ids is 1000, but `max_length` is set to 512",
    ),
]


@contextlib.contextmanager
def generation_config(engine: LookaheadEngine, config: dict[str, Any]) -> Any:
    """The model's generation config with ``config`` set, for the block only."""
    saved = {key: getattr(engine.model.generation_config, key) for key in config}
    engine.model.generation_config.update(**config)
    try:
        yield
    finally:
        engine.model.generation_config.update(**saved)


def generate_under(engine: LookaheadEngine, config: dict[str, Any]) -> torch.Tensor:
    """The drop-in's output of PROMPT with ``config`` set in the model's generation config."""
    with generation_config(engine, config):
        return engine.generate(torch.tensor([PROMPT]))


# (case, the model's generation config, generate's arguments): the drop-in returns the tensor
# `model.generate` returns, however long the prompt is next to the lengths it is given.
GENERATE_LENGTH_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("no length: 20 new tokens", {}, {}),
    ("a prompt past the default max_length", {}, {"input_ids": torch.tensor([PROMPT * 5])}),
    ("the default cut at the model's window", {}, {"input_ids": torch.tensor([PROMPT * 100])}),
    ("max_length", {}, {"max_length": 9}),
    ("the model's max_length", {"max_length": 8}, {}),
    ("max_new_tokens over max_length", {}, {"max_new_tokens": 3, "max_length": 6}),
    ("the model's max_new_tokens over max_length", {"max_new_tokens": 2}, {"max_length": 30}),
]


@pytest.mark.parametrize(
    ("case", "config", "kwargs"), GENERATE_LENGTH_CASES, ids=[c[0] for c in GENERATE_LENGTH_CASES]
)
def test_generate_lengths_are_model_generate_s(engine, case, config, kwargs) -> None:
    kwargs = dict(kwargs)
    ids = kwargs.pop("input_ids", torch.tensor([PROMPT]))
    with generation_config(engine, config):
        with warnings.catch_warnings(record=True) as theirs:
            warnings.simplefilter("always")
            want = engine.model.generate(ids, do_sample=False, **kwargs)
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            got = engine.generate(ids, **kwargs)
    assert torch.equal(got, want), (got.shape, want.shape)
    default = [
        [str(w.message) for w in caught if "default `max_length`" in str(w.message)]
        for caught in (theirs, ours)
    ]
    assert default[0] == default[1]  # the same nudge towards max_new_tokens, where it is given


CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown mode", {"mode": "fast"}, "mode must be"),
    ("unknown draft policy", {"draft_policy": "suffixes"}, "draft_policy must be"),
    ("unknown CPU linear kernel", {"cpu_linear": "mkl"}, "cpu_linear must be"),
    ("unknown step", {"step": "graphs"}, "step must be"),
    ("no slot columns", {"max_model_len": 0}, "max_model_len must be a positive integer"),
    ("slot columns as a float", {"max_model_len": 4096.0}, "max_model_len must be a positive integer"),
    ("the direct forward as a string", {"direct_forward": "yes"}, "direct_forward must be True or False"),
    ("the direct forward as a number", {"direct_forward": 1}, "direct_forward must be True or False"),
    ("no draft tokens", {"decoding_length": 0}, "decoding_length must be a positive integer"),
    ("a node cap of 10**40", {"max_trie_nodes": 10**40}, "max_trie_nodes must be at most"),
    ("a node cap as a float", {"max_trie_nodes": 2e5}, "max_trie_nodes must be a positive integer"),
    ("a batch of none", {"max_batch_size": 0}, "max_batch_size must be a positive integer"),
    (
        "a forward smaller than a batch",
        {"max_batch_size": 8, "max_tokens_per_forward": 4},
        "one token per row",
    ),
    ("no prompt tokens between steps", {"max_prefill_tokens_per_step": 0}, "must be a positive integer"),
    ("n-grams past the budget", {"decoding_length": 2, "ngram_size": 5}, "more than decoding_length"),
    ("a negative prefix cache", {"prefix_cache_mb": -1}, "prefix_cache_mb must be from 0"),
    ("a prefix cache as a float", {"prefix_cache_mb": 0.5}, "prefix_cache_mb must be an integer"),
    ("a prefix cache as a bool", {"prefix_cache_mb": True}, "prefix_cache_mb must be an integer"),
]

TRIE_FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("deeply nested JSON", lambda d: _write(d, "[" * 100_000 + "]" * 100_000), "not a readable trie file"),
    ("a node cap of 10**40", lambda d: trie_file(d, max_nodes=10**40), "bad trie settings"),
    ("a branch length of 10**9", lambda d: trie_file(d, branch_length=10**9), "bad trie settings"),
    ("settings as strings", lambda d: trie_file(d, max_query_length="2"), "bad trie settings"),
    ("a negative token", lambda d: trie_file(d, nodes=[[-5, -1, {"a": 1}]]), "bad token"),
    ("a boolean count", lambda d: trie_file(d, nodes=[[5, -1, {"a": True}]]), "count for 'a'"),
    ("a node before its parent", lambda d: trie_file(d, nodes=[[5, 0, {"a": 1}]]), "parent index"),
    ("nodes not a list", lambda d: trie_file(d, nodes={"5": 1}), "'nodes' must be a list"),
    ("a gzip that is not", lambda d: _write(d, "plain", "trie.json.gz"), "not a readable trie file"),
]


def acceptance_file(tmp_path: Path, **changes: Any) -> Path:
    payload = {"format": "rag-lookahead-acceptance", "version": 1, "key": {"model": "m"}}
    payload |= {"buckets": [["doc1", True, 3, 2.0, 5.0]], "scales": [["doc1", True, 2.0, 1.5, 5.0]]}
    payload |= changes
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps(payload))
    return path


# An acceptance table is a cache: a bad one is reported and learning starts afresh (outputs
# never depend on it), but it is never half-read.
ACCEPTANCE_FILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("not JSON", lambda d: _write(d, "{", "acceptance.json"), "not a readable acceptance table"),
    ("deeply nested JSON", lambda d: _write(d, "[" * 100_000 + "]" * 100_000, "acceptance.json"), "readable"),
    ("another format", lambda d: acceptance_file(d, format="rag-lookahead-trie"), "not an acceptance table"),
    ("buckets not a list", lambda d: acceptance_file(d, buckets={"doc1": 1}), "must be lists"),
    ("more hits than tries", lambda d: _bucket(d, ["doc1", True, 3, 9.0, 5.0]), "more nodes"),
    (
        "a negative count",
        lambda d: acceptance_file(d, scales=[["doc1", True, -1.0, 1.0, 2.0]]),
        "non-negative",
    ),
    ("a boolean count", lambda d: _bucket(d, ["doc1", True, 3, True, 5.0]), "non-negative"),
    ("a decile of 10", lambda d: _bucket(d, ["doc1", True, 10, 1.0, 5.0]), "decile"),
    ("a level as 1", lambda d: _bucket(d, ["doc1", 1, 3, 1.0, 5.0]), "first-level flag"),
    ("a huge source name", lambda d: _bucket(d, ["d" * 999, True, 3, 1.0, 5.0]), "source"),
    ("too many entries", lambda d: _bucket(d, ["doc1", True, 3, 1.0, 5.0], 10_001), "at most"),
]


def _bucket(tmp_path: Path, row: list[Any], copies: int = 1) -> Path:
    return acceptance_file(tmp_path, buckets=[row] * copies)


def _write(directory: Path, text: str, name: str = "trie.json") -> Path:
    path = directory / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("case", "action", "error", "words"), ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
def test_a_hostile_call_is_refused_and_loses_nothing(engine, case, action, error, words) -> None:
    with pytest.raises(error) as raised:
        action(engine)
    assert words in str(raised.value), str(raised.value)
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # nothing of the refused call lingers
    answer = engine.complete(PROMPT, max_new_tokens=N)  # and the engine still answers
    assert answer.token_ids == greedy_reference(engine.model, PROMPT, N)


@pytest.mark.parametrize(("case", "fields", "words"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_hostile_config_is_refused(case, fields, words) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        LookaheadConfig(**fields)
    assert words in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("case", "make", "words"), TRIE_FILE_CASES, ids=[c[0] for c in TRIE_FILE_CASES])
def test_a_hostile_trie_file_is_refused(tmp_path, case, make, words) -> None:
    path = make(tmp_path)
    with pytest.raises(ValueError) as raised:
        TokenTrie.load(path)
    assert words in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    ("case", "make", "words"), ACCEPTANCE_FILE_CASES, ids=[c[0] for c in ACCEPTANCE_FILE_CASES]
)
def test_a_hostile_acceptance_table_is_reported_and_not_used(tmp_path, case, make, words) -> None:
    path = make(tmp_path)
    model = AcceptanceModel()
    with pytest.raises(ValueError) as raised:
        load_acceptance(path, {"model": "m"}, model)
    assert words in str(raised.value), str(raised.value)
    assert model.state() == {"buckets": [], "scales": []}  # nothing half-read
    planner = StepPlanner(LookaheadConfig())
    with pytest.warns(UserWarning, match="learning afresh"):
        planner.load_acceptance(path, {"model": "m"})
    assert planner.acceptance.state() == {"buckets": [], "scales": []}


def test_a_trie_of_another_vocabulary_is_refused(tmp_path) -> None:
    path = trie_file(tmp_path, nodes=[[VOCAB + 3, -1, {"a": 1}]])
    with pytest.raises(ValueError, match="outside a 96-token vocabulary"):
        TokenTrie.load(path, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="built for another tokenizer"):
        LookaheadEngine(tiny_model("llama"), CharTokenizer(), trie=TokenTrie.load(path))


def test_one_string_is_one_document_and_one_stop_string(engine) -> None:
    reference = greedy_reference(engine.model, PROMPT, 2 * N)
    text = CharTokenizer().decode(reference)
    with holding(engine, PROMPT) as hold:  # (the loop runs ahead of its reader)
        streamed = engine.stream(PROMPT, max_new_tokens=2 * N, documents=text)
        next(streamed)
        (owner,) = engine.trie.owners() - {OUTPUT_OWNER}
        assert engine.trie.counts_at(reference[:3]).get(owner) == 1  # the text, not its characters
        hold.release_soon()
        streamed.close()
    stop = text[5:7]
    stopped = engine.complete(PROMPT, max_new_tokens=2 * N, stop_strings=stop)
    assert stopped.stats.finish_reason == "stop_string" and stopped.text == text[: text.index(stop)]


def test_finish_reason_is_none_until_the_stream_ends(engine) -> None:
    with holding(engine, PROMPT) as hold:  # (the loop runs ahead of its reader)
        stream = engine.stream(PROMPT, max_new_tokens=N)
        assert stream.stats.finish_reason is None
        next(stream)
        assert stream.stats.finish_reason is None
        hold.release_soon()
        stream.close()
    assert stream.stats.finish_reason == "abandoned"
    unstarted = engine.stream(PROMPT, max_new_tokens=N)
    unstarted.close()
    assert unstarted.stats.finish_reason == "abandoned"


# ------------------------------------------------------------------ indexing and the CLI (issue 26)


class HashEmbedder:
    """The default embedder's name and tokenizer with vectors from a hash of each text: the index
    and the CLI as they are, without loading the model."""

    name = DEFAULT_EMBEDDER
    dimension = 8

    def __init__(self) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(default_embedder_path())
        self.embedded: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.embedded.extend(texts)
        seeds = [int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) for text in texts]
        rows = np.stack([np.random.default_rng(seed).normal(size=self.dimension) for seed in seeds])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def hash_embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture
def fake_models(monkeypatch, hash_embedder) -> HashEmbedder:
    """The CLI gets `hash_embedder` for every embedder; no model or saved index may load."""
    hash_embedder.embedded.clear()

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model or an index was loaded")

    # Imported before any patch: one imported under the patch of `setup` would take the refusal
    # from it as its own name, and keep it after the test (other tests' CLI runs would fail).
    importlib.import_module("rag_lookahead.cli.answers")
    importlib.import_module("rag_lookahead.cli.benchmark")
    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: hash_embedder)
    monkeypatch.setattr("rag_lookahead.cli.setup.make_embedder", refuse)
    monkeypatch.setattr("rag_lookahead.cli.setup.make_engine", refuse)
    monkeypatch.setattr("rag_lookahead.cli.setup.DocumentIndex.load", refuse)
    monkeypatch.setattr("rag_lookahead.cli.benchmark.make_engine", refuse)
    monkeypatch.setattr("rag_lookahead.cli.benchmark.load_qa_records", refuse)
    return hash_embedder


def _folder(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bees.txt").write_text("Bees make honey from nectar.\n")
    (tmp_path / "elsewhere.txt").write_text("The vault code is 9431.\n")
    return docs


def _link(target: Callable[[Path], Path]) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        docs = _folder(tmp_path)
        (docs / "link.txt").symlink_to(target(tmp_path))
        return docs

    return make


def _linked_folder(tmp_path: Path) -> Path:
    docs = _folder(tmp_path)
    (docs / "sub").mkdir()
    (docs / "sub" / "deep.md").symlink_to(tmp_path / "elsewhere.txt")
    return docs


def _folder_link(target: Callable[[Path], Path]) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        docs = _folder(tmp_path)
        (docs / "shelf").symlink_to(target(tmp_path), target_is_directory=True)
        return docs

    return make


def _outside_folder(tmp_path: Path) -> Path:
    (tmp_path / "vault").mkdir()
    (tmp_path / "vault" / "code.md").write_text("The vault code is 9431.\n")
    return tmp_path / "vault"


# (case, a folder to index) -> one file or folder of it is a link out of it, skipped with the reason
LINK_OUT_CASES: list[tuple[str, Callable[[Path], Path]]] = [
    ("a link to a file beside the folder", _link(lambda d: d / "elsewhere.txt")),
    ("a link to a system file", _link(lambda d: Path("/etc/passwd"))),
    ("a relative link up and out", _link(lambda d: Path("..") / "elsewhere.txt")),
    ("a link in a subfolder", _linked_folder),
    ("a link to a folder outside", _folder_link(_outside_folder)),
    ("a link to the folder above (a loop)", _folder_link(lambda d: Path(".."))),
]


@pytest.mark.parametrize(("case", "make"), LINK_OUT_CASES, ids=[c[0] for c in LINK_OUT_CASES])
def test_an_index_stays_inside_its_folder(tmp_path, hash_embedder, case, make) -> None:
    docs = make(tmp_path)
    index, skipped = DocumentIndex.build([docs], hash_embedder)
    assert list(index.sources) == [str(docs / "bees.txt")]
    assert [s.reason for s in skipped if "a link out of" in s.reason and "--follow-symlinks" in s.reason]
    assert all(hit.chunk.source.endswith("bees.txt") for hit in index.search("vault code root", k=5))
    followed, _ = DocumentIndex.build([docs], hash_embedder, follow_symlinks=True)
    assert len(followed.sources) == 2  # the opt-in reads it


def _broken_link(tmp_path: Path) -> tuple[Path, str]:
    docs = _folder(tmp_path)
    (docs / "gone.md").symlink_to(tmp_path / "deleted.md")
    return docs, "gone.md"


def _link_loop(tmp_path: Path) -> tuple[Path, str]:
    docs = _folder(tmp_path)
    (docs / "a.md").symlink_to("b.md")
    (docs / "b.md").symlink_to("a.md")
    return docs, "a.md"


def _index_inside(tmp_path: Path) -> tuple[Path, str]:
    """`index docs --out docs/idx`, run again: its own chunk file is in the folder it reads."""
    docs = _folder(tmp_path)
    index, _ = DocumentIndex.build([docs], HashEmbedder())
    index.save(docs / "idx")
    return docs, "idx"


def _undecodable_name(tmp_path: Path) -> tuple[Path, str]:
    """A file whose name is Latin-1 (``café.txt`` from an old archive): Python names it with a
    lone surrogate, which no hash, JSON file or terminal takes."""
    docs = _folder(tmp_path)
    name = os.fsdecode(b"caf\xe9.txt")
    try:
        (docs / name).write_text("Cafe notes.\n")
    except OSError:  # a file system that takes only UTF-8 names (macOS)
        pytest.skip("this file system refuses a file name that is not UTF-8")
    return docs, name


def _fifo(tmp_path: Path) -> tuple[Path, str]:
    docs = _folder(tmp_path)
    os.mkfifo(docs / "pipe.txt")
    return docs, "pipe.txt"


def _link_to_a_fifo(tmp_path: Path) -> tuple[Path, str]:
    docs = _folder(tmp_path)
    os.mkfifo(docs / "pipe")
    (docs / "pipe.md").symlink_to("pipe")
    return docs, "pipe.md"


def _holding(name: str, data: bytes) -> Callable[[Path], tuple[Path, str]]:
    def make(tmp_path: Path) -> tuple[Path, str]:
        docs = _folder(tmp_path)
        (docs / name).write_bytes(data)
        return docs, name

    return make


# (case, a folder and the name in it that is listed as skipped, words of the reason): not read,
# and `DocumentIndex.build` and `rag-lookahead index` index the rest and list it
SKIPPED_ENTRY_CASES: list[tuple[str, Callable[[Path], tuple[Path, str]], str]] = [
    ("a broken link", _broken_link, "a broken link"),
    ("a link loop", _link_loop, "a broken link"),
    ("an index inside the folder it indexes", _index_inside, "a rag-lookahead index"),
    ("a file name that is not UTF-8", _undecodable_name, "its name is not UTF-8"),
    ("a FIFO", _fifo, "not a regular file (a FIFO)"),
    ("a link to a FIFO", _link_to_a_fifo, "not a regular file (a FIFO)"),
    (
        "a NUL byte past the first 8 KiB",
        _holding("late.txt", b"Plain words. " * 1000 + b"\0 and more words."),
        "binary content (a NUL byte at offset 13000)",
    ),
    (
        "random bytes",
        _holding("noise.md", np.random.default_rng(0).bytes(4096)),
        "binary content (a NUL byte at offset 82)",
    ),
    (
        "UTF-16 without a byte-order mark",
        _holding("wide.txt", "Plain words.".encode("utf-16-le")),
        "binary content (a NUL byte at offset 1)",
    ),
    (
        "UTF-16 with a byte-order mark and a lone surrogate",
        _holding("wide.md", codecs.BOM_UTF16_LE + "ab".encode("utf-16-le") + b"\x00\xd8c\x00"),
        "not UTF-16 (invalid data at offset 6)",
    ),
    ("records of binary content", _holding("data.jsonl", b"\x00\x01\x02"), "binary content"),
]


@pytest.mark.parametrize(
    ("case", "make", "words"), SKIPPED_ENTRY_CASES, ids=[c[0] for c in SKIPPED_ENTRY_CASES]
)
def test_an_entry_that_is_no_document_is_listed_not_read(
    tmp_path, capsys, monkeypatch, hash_embedder, case, make, words
) -> None:
    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: hash_embedder)
    docs, name = make(tmp_path)
    for follow in (False, True):
        documents, skipped = load_documents([docs], follow_symlinks=follow)
        assert [doc.source for doc in documents] == [str(docs / "bees.txt")]
        assert words in {Path(s.source).name: s.reason for s in skipped}.get(name, ""), skipped
    index, skipped = DocumentIndex.build([docs], hash_embedder)
    assert list(index.sources) == [str(docs / "bees.txt")] and name in {Path(s.source).name for s in skipped}
    capsys.readouterr()
    assert main(["index", str(docs), "--out", str(tmp_path / "out")]) == 0
    assert f"skipped {printable(str(docs / name))}: {words}" in capsys.readouterr().out


def _named_fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "pipe.txt")
    return tmp_path / "pipe.txt"


def _named_link_to_a_fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "pipe.md").symlink_to("pipe")
    return tmp_path / "pipe.md"


def _null_device(tmp_path: Path) -> Path:
    (tmp_path / "null.txt").symlink_to(os.devnull)
    return tmp_path / "null.txt"


# (case, a path named explicitly that is no regular file, words of the reason): listed as skipped
# and never opened (a FIFO's open waits for a writer: the run would hang), the rest indexed
NAMED_ENTRY_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("a FIFO named explicitly", _named_fifo, "not a regular file (a FIFO)"),
    ("a link to a FIFO named explicitly", _named_link_to_a_fifo, "not a regular file (a FIFO)"),
    ("the null device linked as notes.txt", _null_device, "not a regular file (a character device)"),
]


def _within(run: Callable[[], Any], fifo: Path) -> Any:
    """`run()`'s result; a run that blocks in a FIFO fails the test (a writer frees it)."""
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(run()), daemon=True)
    thread.start()
    thread.join(timeout=120)  # only so that a hang fails; a run takes well under a second
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # frees a reader blocked in open
        thread.join(timeout=120)
        pytest.fail("the run blocked on a file that is no regular file")
    return done[0]


@pytest.mark.parametrize(("case", "make", "words"), NAMED_ENTRY_CASES, ids=[c[0] for c in NAMED_ENTRY_CASES])
def test_a_named_entry_that_is_no_regular_file_is_listed_not_opened(
    tmp_path, capsys, monkeypatch, hash_embedder, case, make, words
) -> None:
    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: hash_embedder)
    docs, path = _folder(tmp_path), make(tmp_path)
    bees = docs / "bees.txt"
    documents, skipped = _within(lambda: load_documents([bees, path]), path)
    assert [doc.source for doc in documents] == [str(bees)]
    assert skipped == [Skipped(str(path), words)]
    capsys.readouterr()
    assert _within(lambda: main(["index", str(bees), str(path), "--out", str(tmp_path / "out")]), path) == 0
    assert f"skipped {path}: {words}" in capsys.readouterr().out
    assert list(DocumentIndex.load(tmp_path / "out", hash_embedder).sources) == [str(bees)]


_MARKS = {
    "utf-16-le": codecs.BOM_UTF16_LE,
    "utf-16-be": codecs.BOM_UTF16_BE,
    "utf-32-le": codecs.BOM_UTF32_LE,
    "utf-32-be": codecs.BOM_UTF32_BE,
}
# (case, a file's name, the encoding of its text after that encoding's byte-order mark, the text,
# the texts read): read by its byte-order mark as the text it is, not skipped as binary content
ENCODED_TEXT_CASES: list[tuple[str, str, str, str, list[str]]] = [
    ("UTF-16 LE", "notes.txt", "utf-16-le", "Ünïcode notes.", ["Ünïcode notes."]),
    ("UTF-16 BE", "notes.md", "utf-16-be", "# Kettles\n\nDescale.", ["# Kettles\n\nDescale."]),
    ("UTF-32 LE", "notes.txt", "utf-32-le", "Wide 🚀 notes.", ["Wide 🚀 notes."]),
    ("UTF-32 BE", "notes.md", "utf-32-be", "Wide notes.", ["Wide notes."]),
    ("UTF-16 records", "a.jsonl", "utf-16-le", '{"text": "One."}\r\n{"text": "Two."}\n', ["One.", "Two."]),
]


@pytest.mark.parametrize(
    ("case", "name", "encoding", "text", "texts"), ENCODED_TEXT_CASES, ids=[c[0] for c in ENCODED_TEXT_CASES]
)
def test_text_with_a_unicode_byte_order_mark_is_read_as_text(
    tmp_path, case, name, encoding, text, texts
) -> None:
    (tmp_path / name).write_bytes(_MARKS[encoding] + text.encode(encoding))
    documents, skipped = load_documents([tmp_path / name])
    assert [doc.text for doc in documents] == texts and skipped == []


# (case, a .jsonl record that is valid JSON but no text, words of why it is skipped): its line is
# listed as skipped, every other record is indexed (build and update), and the run succeeds
UNINDEXABLE_RECORD_CASES: list[tuple[str, str, str]] = [
    (
        "a lone high surrogate escaped",
        '{"text": "lone \\ud800 surrogate"}',
        "field 'text' holds a lone surrogate (U+D800 at character 5)",
    ),
    ("a lone low surrogate escaped", '{"text": "tail \\udfff"}', "a lone surrogate (U+DFFF at character 5)"),
    ("a surrogate pair reversed", '{"text": "\\ude80\\ud83d rocket"}', "(U+DE80 at character 0)"),
]


@pytest.mark.parametrize(
    ("case", "record", "words"), UNINDEXABLE_RECORD_CASES, ids=[c[0] for c in UNINDEXABLE_RECORD_CASES]
)
def test_one_bad_record_never_sinks_an_index_run(
    tmp_path, capsys, monkeypatch, hash_embedder, case, record, words
) -> None:
    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: hash_embedder)
    docs = _folder(tmp_path)
    good = ['{"text": "Wasps make paper."}', '{"text": "Rockets \\ud83d\\ude80 fly."}']  # a pair is text
    (docs / "notes.jsonl").write_text("\n".join([good[0], record, good[1]]) + "\n")
    kept = [str(docs / "bees.txt"), f"{docs / 'notes.jsonl'}#1", f"{docs / 'notes.jsonl'}#3"]
    documents, skipped = load_documents([docs])
    assert [doc.source for doc in documents] == kept and documents[2].text == "Rockets \U0001f680 fly."
    assert [s.source for s in skipped] == [f"{docs / 'notes.jsonl'}#2"] and words in skipped[0].reason
    index, _ = DocumentIndex.build([docs], hash_embedder)
    assert list(index.sources) == kept
    out = tmp_path / "out"
    for run in ("built", "updated"):
        capsys.readouterr()
        assert main(["index", str(docs), "--out", str(out), "--embedder", "hash"]) == 0, run
        said = capsys.readouterr().out
        assert run in said and f"skipped {docs / 'notes.jsonl'}#2: " in said and words in said
        assert list(DocumentIndex.load(out, hash_embedder).sources) == kept


# (case, markdown whose text is only in headings, words each a chunk must index)
HEADING_ONLY_CASES: list[tuple[str, str, list[str]]] = [
    ("a heading-only file", "# Rotating the signing keys\n", ["Rotating the signing keys"]),
    (
        "a FAQ written as headings",
        "# FAQ\n\n## How do I rotate the keys?\n\n## How do I reset a password?\n",
        ["rotate the keys", "reset a password"],
    ),
    ("a final heading with no body", "# Setup\n\nInstall it.\n\n## Troubleshooting\n", ["Troubleshooting"]),
    ("a setext title", "Descaling a kettle\n==================\n", ["Descaling a kettle"]),
    ("an empty heading between", "# Vaults\n\n##\n", ["Vaults"]),
]


@pytest.mark.parametrize(
    ("case", "text", "words"), HEADING_ONLY_CASES, ids=[c[0] for c in HEADING_ONLY_CASES]
)
def test_heading_text_is_indexed(hash_embedder, case, text, words) -> None:
    chunks = split_document(Document("notes.md", text), ChunkingConfig(), hash_embedder.tokenizer)
    assert all(text[c.start : c.end] == c.text for c in chunks)
    for phrase in words:
        assert any(phrase in chunk.indexed_text for chunk in chunks), (phrase, chunks)


# (case, a plain-text document hard on the sentence splitter): its chunks are slices of it that
# leave out nothing but whitespace, each within the chunk size
SENTENCE_CASES: list[tuple[str, str]] = [
    ("only abbreviations", "e.g. i.e. etc. U.S. vs. Mr. Dr. Ph.D. a.m. Fig. No. " * 300),
    ("no punctuation at all", " ".join(f"w{i % 97}" for i in range(3000))),
    ("only punctuation", "!!!???... . . . ?! ." * 300),
    ("a very long sentence", "and then " * 3000 + "it ended."),
    ("CJK without spaces", "日本語の文です。次の文。" * 1000),
    ("question marks without spaces", "a?B" * 6000),
    ("emoji, combining accents, right to left", "Emoji 🚀 fine. Cafe\u0301 au lait! שלום עולם. " * 300),
    ("closing quotes and brackets", '"Stop." She stopped. (It rained.) [See Fig. 3.] ' * 300),
    ("control characters", "nul\x00 here. tab\there.\x0b vt. \x1c sep.\x85next. " * 300),
    ("line ends of every kind", "One.\rTwo.\r\nThree.\u2028Four.\n" * 300),
]


@pytest.mark.parametrize(("case", "text"), SENTENCE_CASES, ids=[c[0] for c in SENTENCE_CASES])
def test_hostile_sentences_lose_no_character(hash_embedder, monkeypatch, case, text) -> None:
    seen: list[int] = []
    split = chunking.sentencex.get_sentence_boundaries

    def measured(language: str, piece: str) -> Any:
        seen.append(len(piece))
        return split(language, piece)

    monkeypatch.setattr(chunking.sentencex, "get_sentence_boundaries", measured)
    config = ChunkingConfig(size=48, overlap=12)
    chunks = split_document(Document("notes.txt", text), config, hash_embedder.tokenizer)
    covered = bytearray(len(text))
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
        assert len(hash_embedder.tokenizer(chunk.text, add_special_tokens=False)["input_ids"]) <= 48
        covered[chunk.start : chunk.end] = b"\1" * len(chunk.text)
    assert all(covered[i] or c.isspace() for i, c in enumerate(text))
    # a run without spaces costs sentencex the square of its length: it is given windows
    assert seen and max(seen) <= chunking._SPLIT_WINDOW


# (case, a Document's source and text made in Python, words of the error): refused when made,
# naming the document, so nothing is half indexed
LONE_SURROGATE_DOCUMENT_CASES: list[tuple[str, str, str, str]] = [
    ("in the text", "notes.txt", "ab \ud800 cd.", "notes.txt holds a lone surrogate (U+D800 at character 3)"),
    (
        "a low one at the end",
        "notes.md",
        "text \udc80",
        "notes.md holds a lone surrogate (U+DC80 at character 5)",
    ),
    (
        "in the source: a file name that is not UTF-8",
        os.fsdecode(b"caf\xe9.txt"),
        "Cafe notes.",
        "Document.source 'caf\\udce9.txt' holds a lone surrogate (U+DCE9 at character 3)",
    ),
]


@pytest.mark.parametrize(
    ("case", "source", "text", "words"),
    LONE_SURROGATE_DOCUMENT_CASES,
    ids=[c[0] for c in LONE_SURROGATE_DOCUMENT_CASES],
)
def test_a_lone_surrogate_is_refused_clearly(hash_embedder, case, source, text, words) -> None:
    index = DocumentIndex(hash_embedder)
    with pytest.raises(ValueError) as refused:
        index.add([Document("fine.txt", "Fine text."), Document(source, text)])
    assert words in str(refused.value) and len(index) == 0


def test_an_index_cut_by_punctuation_says_it_keeps_its_rule(
    tmp_path, capsys, monkeypatch, hash_embedder
) -> None:
    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: hash_embedder)
    docs, out = _folder(tmp_path), tmp_path / "index"
    assert main(["index", str(docs), "--out", str(out), "--embedder", "hash"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    del meta["chunking"]["splitter"]  # as saved before the splitter was recorded
    (out / "meta.json").write_text(json.dumps(meta))
    (docs / "ants.txt").write_text("Ants, e.g. wood ants, farm aphids.\n")
    capsys.readouterr()
    assert main(["index", str(docs), "--out", str(out), "--embedder", "hash"]) == 0
    assert "keeping the index's chunking" in (said := capsys.readouterr().out) and "'punctuation'" in said
    chunks = DocumentIndex.load(out, hash_embedder).chunks
    assert [c.text for c in chunks if c.source.endswith("ants.txt")] == ["Ants, e.g. wood ants, farm aphids."]


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("keep me")
    return tmp_path / "notes.txt"


def _a_folder_of_other_things(tmp_path: Path) -> Path:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    return tmp_path / "photos"


# (case, an --out that is not an index, words of the error): refused before anything is embedded
INDEX_OUT_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("--out an existing file", _a_file, "is not a directory"),
    ("--out a folder of other things", _a_folder_of_other_things, "is not a rag-lookahead index"),
]


@pytest.mark.parametrize(("case", "make", "words"), INDEX_OUT_CASES, ids=[c[0] for c in INDEX_OUT_CASES])
def test_index_refuses_an_out_that_is_not_an_index_before_embedding(
    tmp_path, capsys, monkeypatch, case, make, words
) -> None:
    out = make(tmp_path)
    before = sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in [out, *out.glob("*")])
    docs = _folder(tmp_path)
    loaded: list[str] = []
    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: loaded.append("embedder"))
    assert main(["index", str(docs), "--out", str(out)]) == 2
    assert words in capsys.readouterr().err and loaded == []
    assert sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in [out, *out.glob("*")]) == before


def test_two_concurrent_index_runs_lose_neither(tmp_path, monkeypatch, hash_embedder) -> None:
    """Each run waits in its first embedding for the other to get there too: without a lock
    both load the same old index and the later save drops the other's documents."""
    out = tmp_path / "index"
    folders = []
    for name in ("a", "b"):
        folders.append(tmp_path / name)
        folders[-1].mkdir()
        (folders[-1] / f"{name}.txt").write_text(f"Document {name} is about topic {name}.\n")
    meeting = threading.Barrier(2)

    class Waiting(HashEmbedder):
        def __init__(self) -> None:
            self.tokenizer, self.embedded = hash_embedder.tokenizer, []

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            with contextlib.suppress(threading.BrokenBarrierError):
                meeting.wait(timeout=5)  # holding the lock, the first run waits in vain
            return super().embed(texts)

    monkeypatch.setattr("rag_lookahead.cli.answers.make_embedder", lambda path: Waiting())
    argv = [["index", str(folder), "--out", str(out), "--embedder", "hash"] for folder in folders]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert list(pool.map(main, argv)) == [0, 0]
    assert sorted(DocumentIndex.load(out, hash_embedder).sources) == [
        str(f / f"{f.name}.txt") for f in folders
    ]


def _saved_now(target: Path, other: DocumentIndex) -> list[Callable[[], None]]:
    """Another process saves `other` over `target`, whole."""
    return [lambda: other.save(target)]


def _between_renames(target: Path, other: DocumentIndex) -> list[Callable[[], None]]:
    """Another process's save, caught between its two renames (no index at `target`, the old
    one set aside beside it), then done."""
    scratch, aside = target.with_name(".idx.tmp-other"), target.with_name(".idx.old-other")
    other.save(scratch)

    def finish() -> None:
        scratch.rename(target)
        shutil.rmtree(aside)

    return [lambda: target.rename(aside), finish]


# (case, the reading step during which a save happens (of `rag_lookahead.rag.store`, or of
# `KeywordIndex`), that save's steps, one per call of the step): a load sees one whole save
READ_DURING_SAVE_CASES: list[tuple[str, str, Callable[[Path, DocumentIndex], list[Callable[[], None]]]]] = [
    ("a save between meta.json and the chunks", "read_rows", _saved_now),
    ("a save between the keyword digests and the keyword arrays", "KeywordIndex.load", _saved_now),
    ("a save between meta.json and the keyword files", "read_keyword", _saved_now),
    ("a save between its two renames", "read_meta", _between_renames),
]


@pytest.mark.parametrize(
    ("case", "step", "save"), READ_DURING_SAVE_CASES, ids=[c[0] for c in READ_DURING_SAVE_CASES]
)
def test_a_load_while_another_process_saves_sees_one_whole_index(
    tmp_path, monkeypatch, hash_embedder, case, step, save
) -> None:
    docs = _folder(tmp_path)
    (tmp_path / "wasps").mkdir()
    (tmp_path / "wasps" / "wasps.txt").write_text("Wasps build nests of paper.\n")
    target = tmp_path / "idx"
    DocumentIndex.build([docs], hash_embedder)[0].save(target)
    other, _ = DocumentIndex.build([tmp_path / "wasps"], hash_embedder)  # as many chunks
    steps = save(target, other)
    owner: Any = KeywordIndex if step.startswith("KeywordIndex.") else store
    name = step.removeprefix("KeywordIndex.")
    real = getattr(owner, name)

    def during(*args: Any) -> Any:
        if steps:
            steps.pop(0)()
        return real(*args)

    monkeypatch.setattr(owner, name, staticmethod(during) if owner is KeywordIndex else during)
    loaded = DocumentIndex.load(target, hash_embedder)
    assert loaded.chunks == other.chunks and loaded.sources == other.sources
    assert [hit.chunk for hit in loaded.search("wasps paper", k=1, mode="keyword")] == list(other.chunks)


def test_a_line_of_megabytes_is_warned_about_and_not_tokenized_whole(
    tmp_path, capsys, monkeypatch, fake_models
) -> None:
    line = " ".join(f"w{i % 977}" for i in range(30_000))  # no sentence ends, past LONG_LINE
    (tmp_path / "dump.txt").write_text(line)
    tokenizer = fake_models.tokenizer
    longest: list[int] = []

    class Measuring:
        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer, name)

        def __call__(self, text: Any, **kwargs: Any) -> Any:
            longest.append(max(map(len, [text] if isinstance(text, str) else text)))
            return tokenizer(text, **kwargs)

    monkeypatch.setattr(fake_models, "tokenizer", Measuring())
    monkeypatch.setattr(chunking, "_BLOCK_CHARS", 10_000)
    assert main(["index", str(tmp_path / "dump.txt"), "--out", str(tmp_path / "index")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and f"dump.txt has a line of {len(line):,} characters" in err
    assert max(longest) <= 10_000  # counted by its first block, then cut by blocks
    assert fake_models.embedded  # and indexed all the same


def _cli(*argv: str) -> list[str]:
    return list(argv)


# (case, command line, words of the error): refused while parsing, before anything loads
CLI_VALUE_CASES: list[tuple[str, list[str], str]] = [
    ("--top-k -3", _cli("ask", "q", "--index", "i", "--top-k", "-3"), "--top-k: must be a positive integer"),
    (
        "--max-new-tokens 0",
        _cli("ask", "q", "--index", "i", "--max-new-tokens", "0"),
        "--max-new-tokens: must",
    ),
    ("--min-score nan", _cli("chat", "--index", "i", "--min-score", "nan"), "--min-score: must be a finite"),
    ("--min-score 2", _cli("ask", "q", "--index", "i", "--min-score", "2"), "--min-score: must be a cosine"),
    (
        "--port 99999",
        _cli("serve", "--backend", "vllm", "--model", "m", "--port", "99999"),
        "--port: must be",
    ),
    ("--port 0", _cli("serve", "--backend", "vllm", "--model", "m", "--port", "0"), "from 1 to 65535"),
    ("--replicas 0", _cli("serve", "--backend", "ray", "--replicas", "0"), "--replicas: must be a positive"),
    ("--threads 0", _cli("ask", "q", "--index", "i", "--threads", "0"), "--threads: must be a positive"),
    ("--threads -2", _cli("eval-retrieval", "--data", "d", "--threads", "-2"), "--threads: must be"),
    ("serve --threads 0", _cli("serve", "--backend", "local", "--threads", "0"), "--threads: must be"),
    (
        "--min-body-rate -1",
        _cli("serve", "--backend", "local", "--min-body-rate", "-1"),
        "--min-body-rate: must be",
    ),
    (
        "--body-rate-grace-seconds nan",
        _cli("serve", "--backend", "local", "--body-rate-grace-seconds", "nan"),
        "--body-rate-grace-seconds: must be",
    ),
    ("--decoding-length 0", _cli("ask", "q", "--index", "i", "--decoding-length", "0"), "--decoding-length"),
    ("--branch-length -1", _cli("chat", "--index", "i", "--branch-length", "-1"), "--branch-length: must"),
    ("--decoding-length 2", _cli("ask", "q", "--index", "i", "--decoding-length", "2"), "ngram_size"),
    ("--top-k 2.5", _cli("ask", "q", "--index", "i", "--top-k", "2.5"), "--top-k: must be an integer"),
    ("--limit 0", _cli("bench", "--data", "bundled", "--limit", "0"), "--limit: must be a positive"),
    ("--limit -1", _cli("eval-retrieval", "--data", "d", "--limit", "-1"), "--limit: must be a positive"),
    ("--concurrency 1,x", _cli("bench", "--data", "d", "--concurrency", "1,x"), "--concurrency: must be"),
    ("--concurrency 0", _cli("bench", "--data", "d", "--concurrency", "0"), "--concurrency: must be"),
    ("--arrival-rate inf", _cli("bench", "--data", "d", "--arrival-rate", "inf"), "--arrival-rate: must"),
    ("--arrival-rate 0", _cli("bench", "--data", "d", "--arrival-rate", "0"), "--arrival-rate: must"),
    ("--rounds 0", _cli("bench", "--data", "d", "--concurrency", "8", "--rounds", "0"), "--rounds: must be"),
    ("--rounds alone", _cli("bench", "--data", "d", "--rounds", "2"), "--rounds is for --concurrency"),
    ("--chunk-size 0", _cli("index", "d", "--out", "o", "--chunk-size", "0"), "--chunk-size: must be"),
    ("--chunk-overlap -1", _cli("index", "d", "--out", "o", "--chunk-overlap", "-1"), "--chunk-overlap"),
    ("--questions 0", _cli("demo", "--questions", "0"), "--questions: must be a positive integer"),
    ("--questions x", _cli("demo", "--questions", "x"), "--questions: must be an integer"),
    ("measure --threads 0", _cli("measure", "--threads", "0"), "--threads: must be a positive"),
    ("--device tpu", _cli("ask", "q", "--index", "i", "--device", "tpu"), "device must be a torch device"),
    ("serve --device cuda:-1", _cli("serve", "--backend", "local", "--device", "cuda:-1"), "'cuda:-1'"),
]


@pytest.mark.parametrize(("case", "argv", "words"), CLI_VALUE_CASES, ids=[c[0] for c in CLI_VALUE_CASES])
def test_a_bad_cli_value_is_refused_before_anything_loads(capsys, fake_models, case, argv, words) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


# ------------------------------------------------------------------ grammars no answer can end (issue 26)


def grammar_engine() -> LookaheadEngine:
    """The tiny Llama with the fast ASCII tokenizer, which a grammar library can read."""
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    return LookaheadEngine(model, ascii_fast_tokenizer(), LookaheadConfig(mode="trie", min_query_length=1))


SELF_REQUIRING = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
# (case, grammar, error, words of its message): refused at call start, or (a dead end found
# while decoding) the call ends with the error; "eos" is never a text the grammar did not accept.
GRAMMAR_CALL_CASES: list[tuple[str, Grammar, type[Exception], str]] = [
    (
        "a schema that only refers to itself",
        Grammar.json_schema({"$ref": "#"}),
        ValueError,
        "accepts no text",
    ),
    ("a grammar of empty text only", Grammar.regex("a{0}"), ValueError, "accepts only empty text"),
    ("a schema that requires itself", Grammar.json_schema(SELF_REQUIRING), ValueError, "no answer can end"),
    ("a literal past the context window", Grammar.literal("x" * 600), ValueError, "no answer can end"),
    ("a character the vocabulary cannot spell", Grammar.regex("aaa\u00e9"), RuntimeError, "dead end"),
]


@pytest.mark.parametrize(
    ("case", "grammar", "error", "words"), GRAMMAR_CALL_CASES, ids=[c[0] for c in GRAMMAR_CALL_CASES]
)
def test_a_grammar_no_answer_can_complete_fails_its_call_and_loses_nothing(
    case, grammar, error, words
) -> None:
    engine = grammar_engine()
    with pytest.raises(error) as raised:
        engine.complete(PROMPT, max_new_tokens=N, grammar=grammar)
    assert words in str(raised.value), str(raised.value)
    assert "<state>" not in str(raised.value)  # the library's message, not its parser dump
    assert engine.trie.owners() <= {OUTPUT_OWNER}
    assert engine.complete(PROMPT, max_new_tokens=N).stats.finish_reason == "length"


def test_an_end_of_sequence_at_a_dead_end_is_an_error_not_eos() -> None:
    engine = grammar_engine()
    state = engine._facts.grammars.state(Grammar.regex("ab"), [ASCII_VOCAB])
    with pytest.raises(RuntimeError, match="dead end"):
        state.finish([*engine.tokenizer.encode("a"), ASCII_VOCAB])
    state = engine._facts.grammars.state(Grammar.regex("ab"), [ASCII_VOCAB])
    state.finish([*engine.tokenizer.encode("ab"), ASCII_VOCAB])  # complete: a true end


# ------------------------------------------------------------ grammars that close in budget (issue 30)

_PICKY = {"type": "string", "pattern": "^[xyz]{3}$"}  # refuses every closer until it is done
# (case, grammar, max_new_tokens): each call ends without an error, complete (on "eos", text the
# grammar accepts) whenever the budget holds the completion of an empty answer, and loses nothing.
CLOSING_CASES: list[tuple[str, Grammar, int]] = [
    ("one token of budget", Grammar.json(), 1),
    ("a budget below the shortest answer", Grammar.json_schema({"type": "object", "required": ["a"]}), 6),
    ("a string whose pattern refuses every closer", Grammar.json_schema(_PICKY), 8),
    ("a number with a floor", Grammar.json_schema({"type": "integer", "minimum": 700}), 4),
    ("a regex with nothing to close", Grammar.regex("(ab)+c"), 5),
    (
        "required keys in an array of objects",
        Grammar.json_schema(
            {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
                "minItems": 2,
            }
        ),
        24,
    ),
    ("a literal longer than the budget", Grammar.literal("x" * 40), 12),
]


@pytest.mark.parametrize(("case", "grammar", "budget"), CLOSING_CASES, ids=[c[0] for c in CLOSING_CASES])
def test_a_grammar_that_closes_in_budget_ends_well_or_is_cut(case, grammar, budget) -> None:
    engine = grammar_engine()
    closing = grammar.closing_in_budget()
    completion = engine.complete(PROMPT, max_new_tokens=budget, grammar=closing)
    try:
        floor = engine.budget_to_close(closing)
    except ValueError:  # the search finds no completion (a regex it cannot end): as without
        assert (
            completion.token_ids == engine.complete(PROMPT, max_new_tokens=budget, grammar=grammar).token_ids
        )
        floor = None
    if floor is not None and budget >= floor:
        assert completion.stats.finish_reason == "eos" and grammar_accepts(closing, completion.text)
    else:
        assert completion.stats.finish_reason in ("eos", "length")
    assert engine.trie.owners() <= {OUTPUT_OWNER}


_FORTY = [f"k{i}" for i in range(40)]
# (case, grammar, its budget to close) (issue 40): an answer longer than the 256 tokens closing
# once began to look ahead at (the model's long strings left no room for the keys still due),
# and a number range that spelling "0"s never closes; each ends complete at that budget and
# past it, as constrained plain decoding ends it.
CLOSING_FLOOR_CASES: list[tuple[str, Grammar, int]] = [
    (
        "forty required strings, past 256 tokens",
        Grammar.json_schema(
            {"type": "object", "properties": {k: {"type": "string"} for k in _FORTY}, "required": _FORTY}
        ),
        len(json.dumps(dict.fromkeys(_FORTY, ""))) + 1,  # one byte a token, and <eos>
    ),
    (
        "a number only its maximum closes",
        Grammar.json_schema(
            {
                "type": "object",
                "properties": {"f": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.6}},
                "required": ["f"],
            }
        ),
        len('{"f": 0.6}') + 1,
    ),
]


@pytest.mark.parametrize(
    ("case", "grammar", "floor"), CLOSING_FLOOR_CASES, ids=[c[0] for c in CLOSING_FLOOR_CASES]
)
def test_a_budget_to_close_at_any_length_ends_complete(case, grammar, floor) -> None:
    engine = grammar_engine()
    plain = LookaheadEngine(engine.model, engine.tokenizer, LookaheadConfig(mode="off"))
    closing = grammar.closing_in_budget()
    assert engine.budget_to_close(closing) == floor
    for budget in (floor, floor + 20):
        completion = engine.complete(PROMPT, max_new_tokens=budget, grammar=closing)
        assert completion.stats.finish_reason == "eos", completion.text
        assert grammar_accepts(closing, completion.text) and json.loads(completion.text)
        as_plain = plain.complete(PROMPT, max_new_tokens=budget, grammar=closing)
        assert completion.token_ids == as_plain.token_ids


def test_closes_in_budget_is_a_bool() -> None:
    with pytest.raises(TypeError, match="closes_in_budget is True or False"):
        Grammar("json", closes_in_budget=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- nested tool schemas

_ADDRESS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 5}},
    "required": ["city"],
    "additionalProperties": False,
}


def _defs(properties: dict[str, Any], key: str = "$defs") -> dict[str, Any]:
    """Tool parameters as pydantic writes a model nesting ``Address``: defined once, referred to."""
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        key: {"Address": _ADDRESS},
    }


_REF = {"$ref": "#/$defs/Address"}

# (case, a tool's parameters, arguments that keep to them, arguments that do not): each forces
# a call in every tool format, by name and among other tools.
NESTED_TOOL_SCHEMA_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("a nested model", _defs({"home": _REF}), {"home": {"city": "Caen"}}, {"home": {"town": "Caen"}}),
    (
        "a list of nested models",
        _defs({"homes": {"type": "array", "items": _REF}}),
        {"homes": [{"city": "Caen"}, {"city": "Bayeu"}]},
        {"homes": [{"city": "Rouen!"}]},
    ),
    (
        "an Optional nested model",
        _defs({"home": {"anyOf": [_REF, {"type": "null"}]}}),
        {"home": None},
        {"home": {}},
    ),
    (
        "draft-07 definitions",
        _defs({"home": {"$ref": "#/definitions/Address"}}, "definitions"),
        {"home": {"city": "Caen"}},
        {"home": {"city": 14}},
    ),
    (
        "a ref to the root",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "parts": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["name"],
        },
        {"name": "a", "parts": [{"name": "b", "parts": []}]},
        {"name": "a", "parts": [{"parts": []}]},
    ),
    (
        "a ref into the root's properties",
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}},
        {"a": 1, "b": 2},
        {"a": 1, "b": "2"},
    ),
]


def _call_text(fmt: ToolFormat, name: str, arguments: dict[str, Any]) -> str:
    call = json.dumps({"name": name, fmt.arguments_key: arguments})
    return {
        "smollm2": f"<tool_call>[\n{call}\n]</tool_call>",
        "hermes": f"<tool_call>\n{call}\n</tool_call>",
    }.get(fmt.name, call)


@pytest.mark.parametrize(
    ("case", "parameters", "good", "bad"),
    NESTED_TOOL_SCHEMA_CASES,
    ids=[c[0] for c in NESTED_TOOL_SCHEMA_CASES],
)
@pytest.mark.parametrize("format_name", ["smollm2", "hermes", "llama3"])
def test_a_tool_of_nested_schemas_forces_a_call_in_every_format(
    format_name: ToolFormatName,
    case: str,
    parameters: dict[str, Any],
    good: dict[str, Any],
    bad: dict[str, Any],
) -> None:
    fmt = ToolFormat.named(format_name)
    tools = [{"name": "other", "parameters": _defs({"x": _REF})}, {"name": "f", "parameters": parameters}]
    for choice in ("f", None):
        grammar = fmt.grammar(tools, choice)
        assert grammar_accepts(grammar, _call_text(fmt, "f", good)), choice
        assert not grammar_accepts(grammar, _call_text(fmt, "f", bad)), choice


# (case, a tool's parameters, error, words of its message)
TOOL_SCHEMA_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("$defs as a list", {"type": "object", "$defs": [_ADDRESS]}, TypeError, "'$defs' is a mapping of"),
    ("definitions as text", {"type": "object", "definitions": "Address"}, TypeError, "'definitions' is a"),
]


@pytest.mark.parametrize(
    ("case", "parameters", "error", "words"), TOOL_SCHEMA_CASES, ids=[c[0] for c in TOOL_SCHEMA_CASES]
)
def test_a_hostile_tool_schema_is_refused(case, parameters, error, words) -> None:
    tool = {"name": "f", "parameters": parameters}
    with pytest.raises(error) as raised:
        ToolFormat.named("hermes").grammar([tool], "f")
    assert words in str(raised.value) and "tool 'f'" in str(raised.value), str(raised.value)


# ------------------------------------------------------------------ a conversation's history (issue 40)

# (case, history, error, words of its message): refused before anything is retrieved or encoded.
HISTORY_CASES: list[tuple[str, object, type[Exception], str]] = [
    ("an answer of None", [("q", None)], TypeError, "history[0] must be a (question, answer) pair of str"),
    ("a pair of integers", [(1, 2)], TypeError, "history[0] must be a (question, answer) pair of str"),
    ("a 1-tuple", [("q",)], ValueError, "history[0] must be a (question, answer) pair, got 1 items"),
    ("a 3-tuple", [("q", "a", "x")], ValueError, "history[0] must be a (question, answer) pair, got 3 items"),
    ("a turn as a dict", [{"q": "a"}], TypeError, "history[0] must be a (question, answer) pair"),
    ("a turn as a 2-letter string", ["qa"], TypeError, "history[0] must be a (question, answer) pair"),
    ("a later turn", [("q", "a"), ("q", None)], TypeError, "history[1] must be"),
    ("a bare string", "q and a", TypeError, "history must be a sequence of (question, answer) pairs"),
    ("a dict", {"q": "a"}, TypeError, "history must be a sequence"),
    ("a number", 5, TypeError, "history must be a sequence"),
    ("a generator", (t for t in [("q", "a")]), TypeError, "history must be a sequence"),
]


@pytest.mark.parametrize(
    ("case", "history", "error", "words"), HISTORY_CASES, ids=[c[0] for c in HISTORY_CASES]
)
def test_a_history_of_the_wrong_shape_is_refused(engine, hash_embedder, case, history, error, words) -> None:
    # An empty index and a tokenizer without a chat template: any work done would fail otherwise.
    pipeline = RagPipeline(engine, DocumentIndex(hash_embedder))
    for call in (pipeline.ask, pipeline.stream):
        with pytest.raises(error) as raised:
            call("What is it?", history=history)
        assert words in str(raised.value), str(raised.value)
    with pytest.raises(error, match=r"history"):
        rag_messages("What is it?", "Some context.", history=history)  # type: ignore[arg-type]


# ------------------------------------------------------------------ long texts beside decoding (issue 60)

# A document of 12,000 tokens with a period of 997 (the trie stays well under its node cap).
_PERIOD = [(i * 37 + 11) % VOCAB for i in range(997)]
LONG_DOCUMENT = CharTokenizer().decode((_PERIOD * 13)[:12_000])
MANY_DOCUMENTS = [LONG_DOCUMENT[i : i + 50] for i in range(0, 12_000, 50)]


def _long_scope_call(engine: LookaheadEngine) -> None:
    with engine.scope([LONG_DOCUMENT] * 3) as scope:
        engine.complete(PROMPT, max_new_tokens=N, scope=scope)


def _long_documents_added(engine: LookaheadEngine) -> None:
    with engine.scope() as scope:
        scope.add([LONG_DOCUMENT])


# (case, the work on long texts, what takes them in and is watched: the trie's inserts or a
# call's own index of its texts)
LONG_TEXT_CASES: list[tuple[str, Callable[[LookaheadEngine], object], str]] = [
    ("a call's long documents", complete(documents=[LONG_DOCUMENT]), "trie"),
    ("a call's documents, many", complete(documents=MANY_DOCUMENTS), "trie"),
    ("a scope of long documents", lambda engine: engine.scope([LONG_DOCUMENT]).close(), "trie"),
    ("long documents added to a scope", _long_documents_added, "trie"),
    ("a call drafting from a long scope", _long_scope_call, "index"),
]


@pytest.mark.parametrize(("case", "work", "watched"), LONG_TEXT_CASES, ids=[c[0] for c in LONG_TEXT_CASES])
def test_long_texts_go_in_while_a_running_call_steps(engine, monkeypatch, case, work, watched) -> None:
    """Long texts enter the trie (or a call's own index) in slices in the model's thread, and a
    call decoding meanwhile steps between them: it never waits for all of them at once. The
    answers are the same, and no branch is left once the work is done."""
    reference = greedy_reference(engine.model, PROMPT, 500)
    watch = InsertWatch(engine, 32)  # a long text's part: not the running call's few tokens
    watch.start(monkeypatch, watched)
    running = engine.stream(PROMPT, max_new_tokens=500)
    assert next(running) is not None  # decoding
    work(engine)
    assert "".join(running) is not None and running.token_ids == reference
    assert len(set(watch.held)) >= 3, watch.held  # the running call stepped between the slices
    assert engine.trie.owners() <= {OUTPUT_OWNER}


def test_a_call_closed_while_its_long_documents_go_in_leaves_nothing(engine, monkeypatch) -> None:
    """A call ended while its documents go in (its client left) takes no slice more in, and
    its branches leave the trie; the call running beside it is unharmed."""
    slices: list[int] = []
    second, closing = threading.Event(), threading.Event()
    insert, cancel = TokenTrie.insert, engine.scheduler.cancel

    def noted_insert(trie: TokenTrie, tokens: Sequence[int], *args: Any, **kwargs: Any) -> None:
        insert(trie, tokens, *args, **kwargs)
        if len(tokens) >= 32:  # a slice of the long document
            slices.append(len(tokens))
            if len(slices) == 2:  # in hand when the call is closed
                second.set()
                closing.wait(60)  # (a bound)

    def noted_cancel(call: Any, wait: bool = True) -> None:
        call.cancelled = True
        closing.set()
        cancel(call, wait)

    monkeypatch.setattr(TokenTrie, "insert", noted_insert)
    monkeypatch.setattr(engine.scheduler, "cancel", noted_cancel)
    running = engine.stream(PROMPT, max_new_tokens=500)
    assert next(running) is not None  # decoding
    leaving = engine.stream(PROMPT, max_new_tokens=N, documents=[LONG_DOCUMENT])
    assert second.wait(60)
    leaving.close()
    assert leaving.stats.finish_reason == "abandoned" and not leaving.token_ids
    assert len(slices) == 2  # none after the one in hand
    assert "".join(running) is not None and running.token_ids == greedy_reference(engine.model, PROMPT, 500)
    assert engine.trie.owners() <= {OUTPUT_OWNER}
