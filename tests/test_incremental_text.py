"""Streamed text built with `DecodeStream` equals the whole decode, step by step and chunk by chunk."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead.models import _LAYOUT, DEFAULT_MODEL, default_cache_dir
from rag_lookahead.streaming.stopping import Stopping
from rag_lookahead.streaming.text import TextAssembler, incremental_backend
from rag_lookahead.testing import ASCII_VOCAB, BYTE_VOCAB, ascii_fast_tokenizer, byte_fast_tokenizer


class _Whole:
    """A tokenizer that only decodes: what the whole-decode path (today's text) sees."""

    def __init__(self, tokenizer: Any) -> None:
        self.decode = tokenizer.decode


@cache
def _smollm2() -> Any:
    """The real SmolLM2 tokenizer, only if its converted directory is already here."""
    folders = sorted((default_cache_dir() / "models").glob(f"{DEFAULT_MODEL}-*-{_LAYOUT}"))
    if not folders or not (folders[-1] / "tokenizer.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folders[-1], local_files_only=True)


@cache
def _tokenizer(name: str) -> Any:
    if name == "smollm2":
        found = _smollm2()
        if found is None:
            pytest.skip("the converted SmolLM2 is not in the cache (it is never converted for this test)")
        return found
    return {"ascii": ascii_fast_tokenizer, "bytes": byte_fast_tokenizer}[name]()


def _ids(name: str) -> st.SearchStrategy[int]:
    if name == "ascii":
        return st.integers(0, ASCII_VOCAB)  # the last is <eos>, a special token
    if name == "bytes":
        # Mostly the bytes of multi-byte characters, whole, cut or invalid, and <eos>.
        return st.one_of(st.integers(0x80, 0xFF), st.integers(0x20, 0x7F), st.just(BYTE_VOCAB))
    return st.integers(0, 49_151)  # SmolLM2's vocabulary, its special tokens among them


def _steps(name: str) -> st.SearchStrategy[list[list[int]]]:
    return st.lists(st.lists(_ids(name), min_size=0, max_size=5), min_size=1, max_size=12)


def _stopping(tokenizer: Any, stops: Sequence[str]) -> Stopping:
    return Stopping(
        tokenizer, eos=(), stop_strings=stops, max_new_tokens=1 << 20, prompt_length=0, context_window=None
    )


NAMES = ["ascii", "bytes", "smollm2"]


@pytest.mark.parametrize("name", NAMES)
def test_the_test_tokenizers_take_the_incremental_path(name: str) -> None:
    assert incremental_backend(_tokenizer(name)) is not None
    assert incremental_backend(_Whole(_tokenizer(name))) is None


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_incremental_text_is_the_whole_decode_at_every_step(name: str, data: st.DataObject) -> None:
    tokenizer = _tokenizer(name)
    assembler, ids = TextAssembler(tokenizer), []
    for step in data.draw(_steps(name)):
        expected = tokenizer.decode(ids + step, skip_special_tokens=True)
        assert assembler.preview(step) == expected
        assembler.commit(step, expected, assembler.complete_end(expected))
        ids += step
    assert assembler.preview(()) == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("name", ["ascii", "bytes"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_released_chunks_and_stops_are_those_of_the_whole_decode(name: str, data: st.DataObject) -> None:
    tokenizer = _tokenizer(name)
    alphabet = "ab \ufffdé€" if name == "bytes" else "ab "
    stops = data.draw(st.lists(st.text(alphabet, min_size=1, max_size=3), max_size=2))
    fast, whole = _stopping(tokenizer, stops), _stopping(_Whole(tokenizer), stops)
    assert fast.assembler._decoded is not None and whole.assembler._decoded is None
    for step in data.draw(_steps(name)):
        ids = [i % ASCII_VOCAB for i in step] if name == "ascii" else step  # letters, no <eos>
        released = whole.release(ids)
        assert fast.release(ids) == released
        if released.reason is not None:
            break
    assert fast.assembler.flush() == whole.assembler.flush()


def test_a_tokenizer_that_cleans_up_spaces_decodes_whole() -> None:
    tokenizer = ascii_fast_tokenizer()
    tokenizer.clean_up_tokenization_spaces = True
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    assert incremental_backend(tokenizer) is None
    assert TextAssembler(tokenizer).preview([0, ord(".") - 32]) == "."  # " ." cleaned up, as decode does


def test_a_decode_of_its_own_keeps_the_whole_decode() -> None:
    class Shouting(type(ascii_fast_tokenizer())):  # type: ignore[misc]
        def decode(self, *args: Any, **kwargs: Any) -> Any:
            return str(super().decode(*args, **kwargs)).upper()

    tokenizer = ascii_fast_tokenizer()
    tokenizer.__class__ = Shouting
    assert incremental_backend(tokenizer) is None
    assert TextAssembler(tokenizer).preview([ord("a") - 32]) == "A"


def test_a_decode_set_on_the_object_keeps_the_whole_decode() -> None:
    tokenizer = ascii_fast_tokenizer()
    tokenizer.decode = lambda ids, **kwargs: "replaced"
    assert incremental_backend(tokenizer) is None
    assert TextAssembler(tokenizer).preview([1]) == "replaced"
