"""Token counting by the model's own tokenizer, and a model loaded with your own options
(a tiny random model saved to disk: offline, no weights of size)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import ValidationError

from langchain_rag_lookahead import ChatLookahead, LookaheadLLM
from langchain_rag_lookahead.chat_models import to_chat_messages
from rag_lookahead.structured import ToolsNotSupportedError
from rag_lookahead.testing import save_tiny_model

MODELS = [ChatLookahead, LookaheadLLM]
MESSAGES = [SystemMessage("be brief"), HumanMessage("Where is the lighthouse?")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.mark.parametrize("cls", MODELS)
def test_token_ids_come_from_the_models_own_tokenizer(cls: type, engine) -> None:
    llm = cls(engine=engine)
    text = "A lighthouse, at dusk."
    assert llm.get_token_ids(text) == engine.tokenizer(text, add_special_tokens=False).input_ids
    assert llm.get_num_tokens(text) == len(text)  # one character per token in the tiny tokenizer
    assert llm.get_num_tokens("") == 0


@pytest.mark.parametrize("cls", MODELS)
def test_a_custom_token_counter_still_wins(cls: type, engine) -> None:
    llm = cls(engine=engine, custom_get_token_ids=lambda text: [0] * len(text.split()))
    assert llm.get_num_tokens("three short words") == 3


def test_chat_message_tokens_are_the_prompt_the_model_sees(engine) -> None:
    llm = ChatLookahead(engine=engine, max_tokens=4)
    counted = llm.get_num_tokens_from_messages(MESSAGES)
    assert counted == len(engine.encode(to_chat_messages(MESSAGES)))
    assert llm.invoke(MESSAGES).usage_metadata["input_tokens"] == counted
    with pytest.raises(ToolsNotSupportedError, match="no tool support"):  # the tiny template
        llm.get_num_tokens_from_messages(MESSAGES, tools=[{"name": "f"}])


def test_loading_options_reach_the_engine(model_dir) -> None:
    llm = ChatLookahead(
        model=model_dir,
        max_tokens=4,
        model_kwargs={"attn_implementation": "eager", "dtype": "bfloat16"},
        tokenizer_kwargs={"padding_side": "left"},
        chat_template_kwargs={"enable_thinking": False},
    )
    engine = llm.get_engine()
    assert engine.model.config._attn_implementation == "eager" and engine.model.dtype == torch.bfloat16
    assert engine.tokenizer.padding_side == "left"
    messages = [HumanMessage("hi"), AIMessage("hello"), HumanMessage("and?")]
    prompt = engine.tokenizer.decode(engine.encode(to_chat_messages(messages)))
    assert prompt.endswith("/no_think assistant: ")
    assert llm.invoke(messages).usage_metadata["input_tokens"] == len(prompt)


def test_progress_is_shown_while_loading_unless_told_not_to(model_dir) -> None:
    assert ChatLookahead(model=model_dir).get_engine()._progress is True  # on a terminal only
    assert LookaheadLLM(model=model_dir, progress=False).get_engine()._progress is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model_kwargs": {"trust_remote_code": True}}, "trust_remote_code=True itself"),
        ({"model_kwargs": "eager"}, "valid dictionary"),
        ({"tokenizer_kwargs": {"local_files_only": False}}, "never downloads"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "every prompt"),
    ],
)
def test_bad_loading_options_fail_at_construction(options, message) -> None:
    with pytest.raises(ValidationError, match=message):
        ChatLookahead(**options)


@pytest.mark.parametrize("option", ["model_kwargs", "tokenizer_kwargs", "chat_template_kwargs"])
def test_loading_options_and_an_engine_are_exclusive(option: str, engine) -> None:
    with pytest.raises(ValidationError, match="either `engine`"):
        ChatLookahead(engine=engine, **{option: {"x": 1}})


def test_no_model_is_loaded_to_check_options(tmp_path: Path) -> None:
    llm = LookaheadLLM(model=str(tmp_path), model_kwargs={"device_map": "auto"})
    assert llm._resolved is None
