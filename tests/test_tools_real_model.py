"""Tool calling on the default model (SmolLM2-135M-Instruct): its shipped tool template."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from rag_lookahead import LookaheadEngine, rag_messages
from rag_lookahead.models import default_model_dir
from rag_lookahead.structured import Grammar, ToolFormat, detect_tool_format

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
    [
        {"role": "user", "content": "Q1 {{ not jinja }} <|im_end|>"},
        {"role": "assistant", "content": "A1\n\nwith lines"},
        {"role": "user", "content": "Q2 ünïcode"},
    ],
    [{"role": "assistant", "content": "first"}, {"role": "user", "content": ""}],
    [{"role": "system", "content": ""}],
    rag_messages("Who?", context="Some context."),
]


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    torch.set_num_threads(2)
    try:
        return LookaheadEngine.from_pretrained()
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_plain_conversations_render_as_the_model_s_own_template(
    engine: LookaheadEngine, messages: list[dict[str, str]], generation_prompt: bool
) -> None:
    own = AutoTokenizer.from_pretrained(default_model_dir(), local_files_only=True)
    assert own.chat_template != engine.tokenizer.chat_template  # the shipped one is in place
    render = {"tokenize": False, "add_generation_prompt": generation_prompt}
    assert engine.tokenizer.apply_chat_template(messages, **render) == own.apply_chat_template(
        messages, **render
    )


def test_the_default_model_calls_tools_in_its_family_s_format(engine: LookaheadEngine) -> None:
    assert detect_tool_format(engine.tokenizer) == ToolFormat.named("smollm2")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    text = engine.tokenizer.decode(engine.encode(messages, tools=[WEATHER]))
    assert '<tools>[{"name": "get_weather", "description": "The weather in a city."' in text
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    completion = engine.complete(messages, tools=[WEATHER], max_new_tokens=4)
    assert completion.stats.prompt_tokens == len(engine.encode(messages, tools=[WEATHER]))


def test_a_forced_call_parses_against_the_tool_s_schema(engine: LookaheadEngine) -> None:
    fmt = detect_tool_format(engine.tokenizer)
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    grammar = fmt.grammar([WEATHER], "get_weather")
    assert isinstance(grammar, Grammar)
    try:
        completion = engine.complete(messages, tools=[WEATHER], grammar=grammar, max_new_tokens=48)
    except NotImplementedError:
        pytest.skip("constrained decoding is not in the engine yet")
    reply = fmt.parse(completion.text)
    assert reply.invalid == ()
    assert [c.name for c in reply.calls] == ["get_weather"]
    assert isinstance(reply.calls[0].arguments["city"], str)


SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the documents.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


@pytest.mark.parametrize("budget", [24, 32, 40])
def test_a_forced_call_is_complete_in_any_budget_that_holds_one(engine: LookaheadEngine, budget: int) -> None:
    # Greedy, the model writes the query until the tokens run out; the grammar closes the call
    # in time from `budget_to_close` on (about 30 tokens; 24 cannot hold a whole call).
    fmt = detect_tool_format(engine.tokenizer)
    grammar = fmt.grammar([SEARCH])
    messages = [{"role": "user", "content": "What does the corpus say about rotating API keys?"}]
    completion = engine.complete(messages, tools=[SEARCH], grammar=grammar, max_new_tokens=budget)
    reply = fmt.parse(completion.text)
    if budget < engine.budget_to_close(grammar):
        assert completion.stats.finish_reason == "length" and not reply.calls
        return
    assert completion.stats.finish_reason == "eos" and reply.invalid == ()
    assert [c.name for c in reply.calls] == ["search"] and isinstance(reply.calls[0].arguments["query"], str)


def test_a_structured_answer_is_complete_in_a_small_budget(engine: LookaheadEngine) -> None:
    joke = {
        "type": "object",
        "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"}},
        "required": ["setup", "punchline"],
    }
    grammar = Grammar.json_schema(joke).closing_in_budget()
    messages = [{"role": "user", "content": "Tell me a joke about cats"}]
    completion = engine.complete(messages, grammar=grammar, max_new_tokens=24, repetition_penalty=1.1)
    assert completion.stats.finish_reason == "eos"
    assert set(json.loads(completion.text)) == {"setup", "punchline"}
