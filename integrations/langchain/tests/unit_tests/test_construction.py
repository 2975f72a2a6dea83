"""Construction and settings of both models: no model is loaded here."""

import dataclasses

import pytest
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import ValidationError

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from langchain_rag_lookahead._base import LookaheadSettings
from langchain_rag_lookahead.chat_models import to_chat_messages
from rag_lookahead import DEFAULT_MODEL, LookaheadConfig

MODELS = [ChatLookahead, LookaheadLLM]


@pytest.mark.parametrize("cls", MODELS)
def test_no_arguments_means_the_embedded_model_loaded_on_first_use(cls: type) -> None:
    llm = cls()
    assert llm.model_name == DEFAULT_MODEL
    assert llm._resolved is None  # construction is cheap; the first call loads
    assert llm._identifying_params["model_name"] == DEFAULT_MODEL


@pytest.mark.parametrize("cls", MODELS)
def test_unknown_fields_are_rejected(cls: type) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        cls(organization="x")
    with pytest.raises(ValidationError, match="apply to a server"):
        cls(server_kind="vllm")  # known, but only with `base_url`
    with pytest.raises(ValidationError):
        cls(max_tokens=0)
    with pytest.raises(ValidationError):
        cls(temperature=-1)
    with pytest.raises(ValidationError):
        cls(temperature=2.5)  # what a call's temperature may be, as a server's request's


def test_every_field_is_described() -> None:
    for name, info in LookaheadSettings.model_fields.items():
        assert info.description, f"field {name} has no description"


def test_a_local_directory_or_an_engine_but_not_both(tmp_path, engine) -> None:
    assert ChatLookahead(model=str(tmp_path)).model_name == str(tmp_path)
    with pytest.raises(ValidationError, match="not a model directory"):
        ChatLookahead(model=str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match="either `engine`"):
        ChatLookahead(engine=engine, model=str(tmp_path))
    with pytest.raises(ValidationError, match="either `engine`"):
        ChatLookahead(engine=engine, device="cuda")


def test_an_engine_is_shared_as_it_is(engine) -> None:
    llm = ChatLookahead(engine=engine)
    assert llm.get_engine() is engine
    assert llm.resolved_config() == engine.config


def test_lookahead_off_is_the_engines_plain_variant(engine) -> None:
    plain = ChatLookahead(engine=engine, lookahead=False).get_engine()
    assert plain is not engine
    assert plain.model is engine.model and plain.tokenizer is engine.tokenizer
    assert plain.config.mode == "off"
    assert plain.runner is engine.runner and plain.trie is engine.trie  # one seam: engine.with_config


def test_other_drafting_settings_build_a_sibling_engine(engine) -> None:
    config = LookaheadConfig(mode="trie", decoding_length=4)
    sibling = ChatLookahead(engine=engine, lookahead_config=config).get_engine()
    assert sibling.model is engine.model and sibling.config == config
    assert sibling.runner is engine.runner and sibling.trie is engine.trie


def test_a_per_engine_setting_for_a_given_engine_is_refused_at_once(engine) -> None:
    config = dataclasses.replace(engine.config, max_batch_size=engine.config.max_batch_size + 1)
    with pytest.raises(ValidationError, match="max_batch_size is set per engine"):
        ChatLookahead(engine=engine, lookahead_config=config)


def test_identifying_params_name_the_model_and_lookahead_settings(engine) -> None:
    params = ChatLookahead(engine=engine, max_tokens=7, stop=["\n"])._identifying_params
    assert params["lookahead"] is True
    assert params["mode"] == "trie"
    assert params["decoding_length"] == engine.config.decoding_length
    assert params["max_tokens"] == 7 and params["stop"] == ["\n"]
    assert ChatLookahead(lookahead=False)._identifying_params["mode"] == "off"


def test_langsmith_params() -> None:
    llm = ChatLookahead(max_tokens=10, stop=["x"])
    params = llm._get_ls_params()
    assert params["ls_provider"] == "rag_lookahead"
    assert params["ls_model_name"] == DEFAULT_MODEL
    assert params["ls_max_tokens"] == 10 and params["ls_stop"] == ["x"]
    assert LookaheadLLM()._get_ls_params(model="other")["ls_model_name"] == "other"


def test_messages_become_chat_template_roles() -> None:
    messages = [
        SystemMessage("be brief"),
        HumanMessage("hi", name="someone"),
        AIMessage("hello"),
        ToolMessage("42", tool_call_id="t"),
        ChatMessage(role="user", content=[{"type": "text", "text": "and you?"}]),
    ]
    assert to_chat_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "tool", "content": "42", "tool_call_id": "t"},
        {"role": "user", "content": "and you?"},
    ]
    image = {"type": "image", "url": "https://example.com/cat.png"}
    with pytest.raises(ValueError, match="text only"):
        to_chat_messages([HumanMessage(content=[{"type": "text", "text": "look"}, image])])
