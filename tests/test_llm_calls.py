"""What a library's LLM class takes of the adapter core: its calls planned as the server plans
a request (`plan_call`), its replies held back from a tool call (`HeldReply`), and the model's
display name."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest

from rag_lookahead import DEFAULT_MODEL
from rag_lookahead.frontends import display_name
from rag_lookahead.models import default_cache_dir
from rag_lookahead.protocol import HeldReply, RequestError, plan_call, plan_chat
from rag_lookahead.structured import ToolFormat
from rag_lookahead.testing import ascii_fast_tokenizer

MESSAGES = [{"role": "user", "content": "Hi"}]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
SMOLLM2_TEMPLATE = (
    resources.files("rag_lookahead") / "data" / "chat_templates" / "smollm2-tools.jinja"
).read_text(encoding="utf-8")


def engine(tokenizer: Any = None) -> Any:
    """What planning reads of an engine."""
    return SimpleNamespace(chat=True, tokenizer=tokenizer, chat_template_kwargs={})


def test_a_call_of_messages_is_planned_as_a_chat_request() -> None:
    options = {"max_tokens": 5, "temperature": 0, "stop": ["\n"], "documents": ["d"]}
    planned = plan_call("chat", MESSAGES, options, engine())
    assert planned == replace(plan_chat({**options, "messages": MESSAGES}, engine()), prompt=MESSAGES)
    assert planned.kind == "chat" and not planned.params.do_sample


def test_a_text_call_is_planned_as_a_completion_request() -> None:
    planned = plan_call("completion", "Once upon", {"temperature": 0.5, "seed": 3}, engine())
    assert planned.kind == "completion" and planned.prompt == "Once upon"
    assert planned.params.do_sample and planned.params.seed == 3


@pytest.mark.parametrize(
    ("kind", "prompt", "options", "param", "words"),
    [
        ("chat", MESSAGES, {"messages": MESSAGES}, "messages", "unknown parameter"),
        ("completion", "text", {"prompt": "other"}, "prompt", "unknown parameter"),
        ("completion", "text", {"tools": [WEATHER]}, "tools", "unknown parameter"),
        ("chat", MESSAGES, {"model": "m"}, "model", "unknown parameter"),
        ("chat", MESSAGES, {"corpus": "corpus-1"}, "corpus", "unknown parameter"),
        ("chat", MESSAGES, {"temperature": "hot"}, "temperature", "temperature must be a number"),
        ("chat", MESSAGES, {"tools": [WEATHER]}, "tools", "SimpleNamespace has no tokenizer"),
        ("chat", MESSAGES, {"num_beams": 4}, "num_beams", "unknown parameter"),
        ("chat", MESSAGES, {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "from 0 to 20"),
        ("chat", MESSAGES, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        ("chat", MESSAGES, {"top_logprobs": 2}, "top_logprobs", "needs logprobs=true"),
        ("chat", MESSAGES, {"logprobs": 5}, "logprobs", "true or false"),
        ("chat", MESSAGES, {"logprobs": "yes"}, "logprobs", "true or false"),
        ("completion", "text", {"logprobs": 21}, "logprobs", "from 0 to 20"),
        ("completion", "text", {"logprobs": 2, "top_logprobs": 2}, "top_logprobs", "give one"),
        ("completion", "text", {"logprobs": 1.5}, "logprobs", "true, false or an integer"),
    ],
)
def test_hostile_calls_are_request_errors(
    kind: Any, prompt: Any, options: Any, param: str, words: str
) -> None:
    with pytest.raises(RequestError, match=words) as info:
        plan_call(kind, prompt, options, engine())
    assert info.value.param == param


def test_tools_plan_on_a_chat_template() -> None:
    planned = plan_call(
        "chat",
        MESSAGES,
        {"tools": [WEATHER], "tool_choice": "required"},
        engine(ascii_fast_tokenizer(SMOLLM2_TEMPLATE)),
    )
    assert planned.tools.format is not None and planned.params.grammar is not None


def test_a_held_reply_shows_content_up_to_where_a_call_may_begin() -> None:
    plain = HeldReply(None)
    assert [plain.add(p) for p in ("a", "<tool", "_call>")] == ["a", "<tool", "_call>"]
    held = HeldReply(ToolFormat.named("smollm2"))
    assert held.add("Looking. <tool") == "Looking. "
    assert held.add("_call>[{") == "" and held.shown_text == "Looking. "


def test_display_names() -> None:
    def named(name: str) -> Any:
        return SimpleNamespace(model_name=name)

    converted = default_cache_dir() / "models" / f"{DEFAULT_MODEL}-q8_0"
    assert display_name(named(str(converted))) == DEFAULT_MODEL
    assert display_name(named("")) == DEFAULT_MODEL
    assert display_name(named("served-model")) == "served-model"
    own = f"/data/{DEFAULT_MODEL}-finetuned"  # a folder of the user's, not the cache's
    assert display_name(named(own)) == own
