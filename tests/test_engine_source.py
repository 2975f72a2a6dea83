"""Where a front end's engine comes from (`EngineSource`): one given, a server at a
``base_url``, a model to load, or the default; every bad combination refused when made, with the
same words for every adapter; and a local call's deadline (`within_deadline`)."""

from __future__ import annotations

from typing import Any

import pytest

from rag_lookahead import DEFAULT_MODEL, LoadOptions, LookaheadConfig
from rag_lookahead.frontends import EngineSource, plain_engine
from rag_lookahead.protocol import within_deadline
from rag_lookahead.remote import ServerEngine
from rag_lookahead.testing import read_past_deadline, tiny_engine

SERVER = "http://127.0.0.1:9/v1"
MESSAGES = [{"role": "user", "content": "Where is the lighthouse?"}]


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine()


def test_nothing_given_is_the_default_model_loaded_later() -> None:
    source = EngineSource()
    assert source.model_name == DEFAULT_MODEL
    assert source.config == LookaheadConfig() and source.deadline is None
    assert EngineSource(lookahead=False).config == LookaheadConfig(mode="off")
    assert EngineSource(timeout=3).deadline == 3


def test_a_given_engine_is_used_as_it_is_or_as_its_variant(engine: Any) -> None:
    assert EngineSource(engine=engine).resolve() is engine
    plain = EngineSource(engine=engine, lookahead=False).resolve()
    assert plain.config.mode == "off" and plain.trie is engine.trie and plain.runner is engine.runner
    config = LookaheadConfig(mode="trie", decoding_length=4)
    variant = EngineSource(engine=engine, lookahead_config=config).resolve()
    assert variant.config == config and variant.trie is engine.trie
    assert plain_engine(engine) is plain_engine(engine)  # one twin per engine


def test_a_server_at_base_url() -> None:
    server = {"kind": "sglang", "api_key": "k", "max_retries": 0, "context_window": 4096}
    source = EngineSource(load=LoadOptions("served"), base_url=SERVER, server=server, timeout=5)
    assert source.model_name == "served" and source.config is None
    assert source.deadline is None  # the timeout is the server's
    engine = source.resolve()
    assert isinstance(engine, ServerEngine)
    assert (engine.config.kind, engine.config.api_key, engine.config.timeout) == ("sglang", "k", 5)
    assert (engine.config.max_retries, engine.context_window) == (0, 4096)
    with pytest.raises(ValueError, match="lookahead_config"):
        EngineSource(engine=engine, lookahead_config=LookaheadConfig())


BAD_SOURCES: list[tuple[dict[str, Any], str]] = [
    ({"engine": "E", "base_url": SERVER}, "either an engine or a server"),
    ({"engine": "E", "load": LoadOptions(device="cpu")}, "pass either `engine` or device"),
    ({"engine": "E", "load": LoadOptions("m")}, "either an engine or options to load one"),
    ({"base_url": SERVER}, "with `base_url`, `model` is the served model's name"),
    ({"base_url": SERVER, "load": LoadOptions("m", dtype="bfloat16")}, r"\['dtype'\] apply to a local"),
    ({"base_url": SERVER, "load": LoadOptions("m"), "lookahead_config": LookaheadConfig()}, "local model"),
    ({"base_url": SERVER, "load": LoadOptions("m"), "lookahead": False}, "lookahead=False"),
    ({"base_url": "ftp://x", "load": LoadOptions("m")}, "base_url must be an http"),
    ({"base_url": SERVER, "load": LoadOptions("m"), "server": {"kind": "tgi"}}, "kind must be one of"),
    ({"server": {"api_key": "k", "kind": None}}, r"\['api_key'\] apply to a server"),
    ({"timeout": 0}, "timeout must be"),
    ({"timeout": True}, "timeout must be"),
    ({"load": LoadOptions("./no/such/model")}, "not a model directory"),
]


@pytest.mark.parametrize(("fields", "words"), BAD_SOURCES)
def test_bad_sources_are_refused_when_made(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        EngineSource(**fields)


def test_a_deadline_ends_a_call_with_timeout_error(engine: Any) -> None:
    stream = engine.stream(MESSAGES, max_new_tokens=200)
    with pytest.raises(TimeoutError, match="timeout of 0.05 s"):
        read_past_deadline(within_deadline(stream.chunks(), stream, 0.05), 0.05)
    assert stream.stats.finish_reason == "abandoned"
    assert not engine.trie.owners() - {"__output__"}


def test_a_call_within_its_deadline_is_unchanged(engine: Any) -> None:
    reference = engine.complete(MESSAGES, max_new_tokens=12).text
    for seconds in (None, 600.0):
        stream = engine.stream(MESSAGES, max_new_tokens=12)
        assert "".join(within_deadline(stream, stream, seconds)) == reference


def _loaded_as(monkeypatch: pytest.MonkeyPatch, engine: Any) -> list[bool]:
    """Every model load answers with ``engine``'s model; the list receives each load's
    ``progress``."""
    import rag_lookahead.models

    asked: list[bool] = []

    def load_model(*args: Any, progress: bool = False, **kwargs: Any) -> Any:
        asked.append(progress)
        return engine.model, engine.tokenizer

    monkeypatch.setattr(rag_lookahead.models, "load_model", load_model)
    return asked


def test_a_front_end_shows_progress_while_it_loads_unless_told_not_to(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _loaded_as(monkeypatch, engine)
    assert EngineSource().resolve()._progress is True  # the cost measurement's bar too
    assert EngineSource(progress=False).resolve()._progress is False
    assert EngineSource(load=LoadOptions(progress=True), progress=False).resolve()._progress is True
    assert asked == [True, False, True]
    with pytest.raises(TypeError, match="progress must be True or False"):
        EngineSource(progress=1)  # type: ignore[arg-type]
