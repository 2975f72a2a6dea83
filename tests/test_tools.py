"""Tool calling: formats read off chat templates, tools rendered through the one prompt path,
replies parsed into calls, and the grammars that force a call."""

import json
from importlib import resources
from itertools import count

import pytest
from pydantic import BaseModel, ConfigDict

from rag_lookahead.prompts import check_chat_template_kwargs, encode_prompt
from rag_lookahead.remote import ServerEngine
from rag_lookahead.structured import (
    Grammar,
    ToolFormat,
    ToolsNotSupportedError,
    check_tools,
    detect_tool_format,
)
from rag_lookahead.structured.tools import template_messages, tool_choice
from rag_lookahead.testing import (
    ascii_fast_tokenizer,
    grammar_accepts,
    nested_person,
    tiny_engine,
    tiny_tool_engine,
    weather_tool,
)
from rag_lookahead.testing.models import TINY_CHAT_TEMPLATE

WEATHER = weather_tool()
SEARCH = {"name": "search", "description": "Search the corpus.", "parameters": {"type": "object"}}

# Small templates that write calls as Qwen 2.5 / Hermes and Llama 3.1 do.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == 'user' and loop.first and tools %}user: Use these functions:
{% for t in tools %}{{ t | tojson(indent=4) }}{% endfor %} {{ message.content }}{{ ' | ' }}
{%- elif message.tool_calls %}assistant: {% set call = message.tool_calls[0].function %}
{{- '{"name": "' + call.name + '", ' }}{{ '"parameters": ' }}{{ call.arguments | tojson }}{{ "}" }}{{ ' | ' }}
{%- elif message.role == 'tool' %}ipython: {{ message.content }}{{ ' | ' }}
{%- else %}{{ message.role }}: {{ message.content }} | {% endif %}
{%- endfor %}{% if add_generation_prompt %}assistant: {% endif %}"""


def packaged(name: str) -> str:
    return (resources.files("rag_lookahead") / "data" / "chat_templates" / name).read_text(encoding="utf-8")


SMOLLM2_TEMPLATE = packaged("smollm2-tools.jinja")


def ids() -> object:
    counter = count()
    return lambda: f"call_{next(counter)}"


# ---------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("template", "name"),
    [(SMOLLM2_TEMPLATE, "smollm2"), (HERMES_TEMPLATE, "hermes"), (LLAMA3_TEMPLATE, "llama3")],
)
def test_the_format_is_read_off_the_template(template: str, name: str) -> None:
    assert detect_tool_format(ascii_fast_tokenizer(template)) == ToolFormat.named(name)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (TINY_CHAT_TEMPLATE, "has no tool support"),
        (packaged("gemma3.jinja"), "cannot render tool calls"),  # it raises on the tool turn
        ("{% for m in messages %}{{ m.content }}{{ tools }}{% endfor %}", "does not read"),
        ("{{ raise_exception('no tools here') }}", "no tools here"),
    ],
)
def test_a_template_without_tool_support_is_a_clear_error(template: str, message: str) -> None:
    with pytest.raises(ToolsNotSupportedError, match=message):
        detect_tool_format(ascii_fast_tokenizer(template))


def test_a_tokenizer_without_a_template_is_a_clear_error() -> None:
    tokenizer = ascii_fast_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ToolsNotSupportedError, match="no chat template"):
        detect_tool_format(tokenizer)


# ---------------------------------------------------------------------------- rendering


def test_tools_reach_the_prompt_through_the_one_prompt_path() -> None:
    tokenizer = ascii_fast_tokenizer(HERMES_TEMPLATE)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    plain = encode_prompt(tokenizer, messages)
    with_tools = encode_prompt(tokenizer, messages, tools=[WEATHER, SEARCH])
    text = tokenizer.decode(with_tools)
    assert '"name": "get_weather"' in text and '"name": "search"' in text
    assert with_tools[-len(plain) :] == plain  # the tools come first, the conversation is unchanged
    assert encode_prompt(tokenizer, messages, tools=[]) == plain


def test_a_conversation_with_calls_and_results_renders() -> None:
    tokenizer = ascii_fast_tokenizer(SMOLLM2_TEMPLATE)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    text = tokenizer.apply_chat_template(
        template_messages(messages), tools=check_tools([WEATHER]), tokenize=False, add_generation_prompt=True
    )
    assert encode_prompt(tokenizer, messages, tools=[WEATHER]) == tokenizer(text).input_ids
    assert '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]</tool_call>' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("tools", "error", "match"),
    [
        ({"name": "x"}, TypeError, "sequence of tool descriptions"),
        ("get_weather", TypeError, "sequence of tool descriptions"),
        ([42], TypeError, "tool 0 is a mapping"),
        ([{"type": "retrieval", "function": {"name": "x"}}], ValueError, "only 'function' tools"),
        ([{"name": ""}], ValueError, "needs a name"),
        ([{"name": "has space"}], ValueError, "needs a name"),
        ([{"name": "x", "parameters": "object"}], TypeError, "parameters are a JSON schema"),
        ([{"name": "x", "description": 3}], TypeError, "description is a string"),
        ([{"name": "x", "parameters": {"default": float("nan")}}], ValueError, "cannot be written as JSON"),
        ([{"name": "x"}, {"name": "x"}], ValueError, "unique; repeated: \\['x'\\]"),
    ],
)
def test_bad_tools_are_refused(tools: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_tools(tools)  # type: ignore[arg-type]


def test_tools_are_normalised_to_openai_function_tools() -> None:
    assert check_tools([SEARCH]) == [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the corpus.",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert check_tools([{"name": "ping"}])[0]["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }


@pytest.mark.parametrize(
    ("prompt", "match"),
    [("Weather?", "needs a prompt of chat messages"), ([1, 2, 3], "needs a prompt of chat messages")],
)
def test_tools_need_chat_messages(prompt: object, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        encode_prompt(ascii_fast_tokenizer(HERMES_TEMPLATE), prompt, tools=[WEATHER])  # type: ignore[arg-type]


def test_tools_with_a_template_without_tool_support_name_the_problem() -> None:
    with pytest.raises(ToolsNotSupportedError, match="has no tool support"):
        encode_prompt(ascii_fast_tokenizer(), [{"role": "user", "content": "hi"}], tools=[WEATHER])


def test_tools_are_not_a_template_variable() -> None:
    with pytest.raises(ValueError, match="pass tools to the call"):
        check_chat_template_kwargs({"tools": [WEATHER]})


@pytest.mark.parametrize(
    ("calls", "error", "match"),
    [
        ("get_weather", TypeError, "tool_calls are a sequence"),
        ([7], TypeError, "tool calls are mappings"),
        ([{"function": {"arguments": {}}}], ValueError, "has no name"),
        ([{"function": {"name": "f", "arguments": "{oops"}}], ValueError, "arguments are not JSON"),
        ([{"function": {"name": "f", "arguments": [1]}}], ValueError, "arguments are a JSON object"),
    ],
)
def test_bad_tool_calls_in_messages_are_refused(calls: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        template_messages([{"role": "assistant", "content": "", "tool_calls": calls}])


# ---------------------------------------------------------------------------- parsing

SMOLLM2 = ToolFormat.named("smollm2")
HERMES = ToolFormat.named("hermes")
LLAMA3 = ToolFormat.named("llama3")


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        (
            SMOLLM2,
            '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]</tool_call>',
            "",
            [("get_weather", {"city": "Paris"})],
        ),
        (
            SMOLLM2,
            'Sure.\n<tool_call>[{"name": "a", "arguments": {}}, '
            '{"name": "b", "arguments": {"x": 1}}]</tool_call>',
            "Sure.",
            [("a", {}), ("b", {"x": 1})],
        ),
        (SMOLLM2, "<tool_call>[]</tool_call>", "", []),
        (
            SMOLLM2,
            '<tool_call>[{"name": "a", "arguments": {"q": "</tool_call> inside"}}]</tool_call> after',
            "after",
            [("a", {"q": "</tool_call> inside"})],
        ),
        (SMOLLM2, "No tool is needed: it is 4.", "No tool is needed: it is 4.", []),
        (
            HERMES,
            'Let me look.<tool_call>\n{"name": "a", "arguments": {"q": "x"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
            "Let me look.",
            [("a", {"q": "x"}), ("b", {})],
        ),
        (
            LLAMA3,
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "",
            [("get_weather", {"city": "Paris"})],
        ),
        (
            LLAMA3,
            '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": [1]}}',
            "",
            [("a", {}), ("b", {"k": [1]})],
        ),
        (LLAMA3, '{"answer": 42}', '{"answer": 42}', []),
        (LLAMA3, "It is sunny.", "It is sunny.", []),
    ],
)
def test_replies_parse_into_content_and_calls(fmt: ToolFormat, text: str, content: str, calls: list) -> None:
    reply = fmt.parse(text, make_id=ids())  # type: ignore[arg-type]
    assert reply.content == content
    assert [(c.name, dict(c.arguments)) for c in reply.calls] == calls
    assert [c.id for c in reply.calls] == [f"call_{i}" for i in range(len(calls))]
    assert reply.invalid == ()


@pytest.mark.parametrize(
    ("fmt", "text", "match"),
    [
        (SMOLLM2, '<tool_call>[{"name": "a", "argu', "not closed"),
        (SMOLLM2, "<tool_call>[{name: a}]</tool_call>", "not valid JSON"),
        (SMOLLM2, '<tool_call>[{"name": "a", "arguments": {"q": "x]</tool_call> cut', "not valid JSON"),
        (SMOLLM2, '<tool_call>[{"name": "a", "arguments": {}}] trailing</tool_call>', "not valid JSON"),
        (SMOLLM2, '<tool_call>[{"arguments": {}}]</tool_call>', "has no name"),
        (SMOLLM2, '<tool_call>["a"]</tool_call>', "is a JSON object"),
        (HERMES, '<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>', "are not a JSON object"),
        (HERMES, '<tool_call>\n[{"name": "a", "arguments": {}}]\n</tool_call>', "is a JSON object"),
        (LLAMA3, '{"name": "a", "parameters": {"x": ', "not valid JSON"),
    ],
)
def test_broken_calls_are_reported_not_invented(fmt: ToolFormat, text: str, match: str) -> None:
    reply = fmt.parse(text)
    assert reply.calls == ()
    assert len(reply.invalid) == 1
    assert match in reply.invalid[0].error
    assert reply.invalid[0].id.startswith("call_")


def test_generated_ids_are_unique() -> None:
    reply = SMOLLM2.parse(
        '<tool_call>[{"name": "a", "arguments": {}}, {"name": "a", "arguments": {}}]</tool_call>'
    )
    assert len({c.id for c in reply.calls}) == 2


def test_a_parsed_call_round_trips_through_the_template() -> None:
    tokenizer = ascii_fast_tokenizer(SMOLLM2_TEMPLATE)
    call = SMOLLM2.parse(
        '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]</tool_call>'
    ).calls[0]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call.as_message_call()]},
    ]
    text = tokenizer.apply_chat_template(
        template_messages(messages), tools=check_tools([WEATHER]), tokenize=False
    )
    assert '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]</tool_call>' in text


@pytest.mark.parametrize(
    ("fmt", "text", "shown"),
    [
        (SMOLLM2, "Hello", "Hello"),
        (SMOLLM2, "Hello <tool", "Hello "),
        (SMOLLM2, "Hello <tool_call>[{", "Hello "),
        (SMOLLM2, "a < b", "a < b"),
        (HERMES, "<", ""),
        (LLAMA3, "  {", ""),
        (LLAMA3, "<|python", ""),
        (LLAMA3, "It is", "It is"),
        (LLAMA3, "", ""),
    ],
)
def test_streaming_holds_back_what_may_be_a_call(fmt: ToolFormat, text: str, shown: str) -> None:
    assert text[: fmt.content_end(text)] == shown


# ---------------------------------------------------------------------------- grammars


def call_schema(name: str, key: str = "arguments", parameters: dict | None = None) -> Grammar:
    parameters = {**(parameters or {"type": "object"}), "additionalProperties": False}
    return Grammar.json_schema(
        {
            "type": "object",
            "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key],
            "additionalProperties": False,
        }
    )


def test_a_forced_call_to_a_named_tool_is_the_model_s_own_block() -> None:
    weather = call_schema("get_weather", parameters=WEATHER["function"]["parameters"])  # type: ignore[index]
    # Each closes in budget: a call the tokens left can still complete is completed.
    smollm2 = Grammar.sequence(Grammar.literal("<tool_call>[\n"), weather, Grammar.literal("\n]</tool_call>"))
    assert SMOLLM2.grammar([WEATHER, SEARCH], "get_weather") == smollm2.closing_in_budget()
    hermes = Grammar.sequence(Grammar.literal("<tool_call>\n"), weather, Grammar.literal("\n</tool_call>"))
    assert HERMES.grammar([WEATHER, SEARCH], "get_weather") == hermes.closing_in_budget()
    llama = call_schema("get_weather", "parameters", WEATHER["function"]["parameters"])  # type: ignore[index]
    assert LLAMA3.grammar([WEATHER], "get_weather") == llama.closing_in_budget()


def test_a_forced_call_keeps_a_schema_s_own_additional_properties() -> None:
    open_ended = {"name": "f", "parameters": {"type": "object", "additionalProperties": {"type": "string"}}}
    schema = json.loads(SMOLLM2.grammar([open_ended]).parts[1].value)
    assert schema["properties"]["arguments"]["additionalProperties"] == {"type": "string"}


def test_a_forced_call_to_any_tool_is_a_choice() -> None:
    grammar = HERMES.grammar([WEATHER, SEARCH])
    assert grammar.kind == "sequence"
    choice = grammar.parts[1]
    assert choice.kind == "choice"
    assert [json.loads(p.value)["properties"]["name"]["const"] for p in choice.parts] == [
        "get_weather",
        "search",
    ]


@pytest.mark.parametrize(
    ("tools", "name", "match"),
    [([], None, "at least one tool"), ([WEATHER], "nope", "no tool named 'nope'")],
)
def test_a_forced_call_needs_a_known_tool(tools: list, name: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SMOLLM2.grammar(tools, name)


def test_an_unknown_format_name_is_refused() -> None:
    with pytest.raises(ValueError, match="tool formats are"):
        ToolFormat.named("mistral")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- engines


def test_an_engine_whose_template_has_no_tools_refuses_them() -> None:
    engine = tiny_engine()
    with pytest.raises(ToolsNotSupportedError, match="no tool support"):
        engine.complete([{"role": "user", "content": "hi"}], tools=[WEATHER], max_new_tokens=2)


def test_a_server_engine_refuses_tools_with_the_reason() -> None:
    engine = ServerEngine("http://127.0.0.1:9/v1", "served-model", "vllm", max_retries=0)
    with pytest.raises(NotImplementedError, match="not supported on a server engine"):
        engine.stream([{"role": "user", "content": "hi"}], tools=[WEATHER])
    with pytest.raises(NotImplementedError, match="not supported on a server engine"):
        engine.encode([{"role": "user", "content": "hi"}], tools=[WEATHER])


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, "auto"),
        ("auto", "auto"),
        ("none", "none"),
        (False, "none"),
        ("any", "any"),
        ("required", "any"),
        (True, "any"),
        ("get_weather", "get_weather"),
        ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
    ],
)
def test_tool_choice_in_every_spelling_of_the_ecosystems(choice: object, expected: str) -> None:
    assert tool_choice(choice, ["get_weather", "search"]) == expected


@pytest.mark.parametrize(
    ("choice", "names", "words"),
    [
        ("missing", ["get_weather"], "tool_choice is"),
        (3, ["get_weather"], "tool_choice is"),
        ({"type": "function"}, ["get_weather"], "tool_choice is"),
        ("required", [], "no tools are given"),
        ("get_weather", [], "tool_choice is"),
    ],
)
def test_a_hostile_tool_choice_is_refused(choice: object, names: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        tool_choice(choice, names)


# ---------------------------------------------------------------------------- nested models


Person = nested_person()


SAVE = {"name": "save_person", "description": "Save a person.", "parameters": Person.model_json_schema()}
CAEN = {"street": "Rue", "city": "Caen"}
ANN = {"name": "Ann", "address": CAEN, "previous": [CAEN, CAEN], "billing": None}
FORMATS = [SMOLLM2, HERMES, LLAMA3]


def call_text(fmt: ToolFormat, name: str, arguments: dict) -> str:
    """A call as the model writes it in ``fmt`` (JSON laid out as the grammar lays it out)."""
    call = json.dumps({"name": name, fmt.arguments_key: arguments})
    if fmt.name == "smollm2":
        return f"<tool_call>[\n{call}\n]</tool_call>"
    return f"<tool_call>\n{call}\n</tool_call>" if fmt.name == "hermes" else call


def test_pydantic_writes_the_nested_model_as_a_ref() -> None:
    assert "Address" in SAVE["parameters"]["$defs"]  # type: ignore[index]
    assert SAVE["parameters"]["properties"]["address"] == {"$ref": "#/$defs/Address"}  # type: ignore[index]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("name", ["save_person", None], ids=["by name", "any"])
def test_a_forced_call_to_a_tool_of_nested_models_keeps_to_them(fmt: ToolFormat, name: str | None) -> None:
    grammar = fmt.grammar([WEATHER, SAVE], name)
    assert grammar_accepts(grammar, call_text(fmt, "save_person", ANN))
    assert grammar_accepts(grammar, call_text(fmt, "save_person", {**ANN, "billing": CAEN}))
    assert grammar_accepts(grammar, call_text(fmt, "save_person", {"name": "Bo", "address": CAEN}))
    for wrong in [
        {**ANN, "address": {"street": "Rue"}},  # the nested model's required field
        {**ANN, "previous": [{"street": "Rue", "city": 3}]},  # a list item's field type
        {**ANN, "billing": {**CAEN, "zip": "1"}},  # the Optional model is still closed
        {**ANN, "address": {**CAEN, "city": "Rouen"}},  # a nested field's bound
    ]:
        assert not grammar_accepts(grammar, call_text(fmt, "save_person", wrong)), wrong
    assert grammar_accepts(grammar, call_text(fmt, "get_weather", {"city": "Caen"})) == (name is None)


def test_a_call_schema_lifts_the_definitions_to_its_root() -> None:
    schema = HERMES.call_schema(check_tools([SAVE])[0])
    assert schema["$defs"] == Person.model_json_schema()["$defs"]
    arguments = schema["properties"]["arguments"]
    assert "$defs" not in arguments and arguments["properties"]["address"] == {"$ref": "#/$defs/Address"}
    assert SAVE["parameters"]["$defs"]  # type: ignore[index]  # the tool itself is left as it was


def test_two_tools_with_a_same_named_definition_keep_their_own() -> None:
    class Place(BaseModel):  # another "Address": a post code, no city
        model_config = ConfigDict(extra="forbid")
        code: str

    class Parcel(BaseModel):
        address: Place

    schema = Parcel.model_json_schema()
    schema["$defs"] = {"Address": schema["$defs"].pop("Place")}
    schema["properties"]["address"] = {"$ref": "#/$defs/Address"}
    send = {"name": "send_parcel", "parameters": schema}
    for fmt in FORMATS:
        grammar = fmt.grammar([SAVE, send])
        assert grammar_accepts(grammar, call_text(fmt, "save_person", ANN))
        assert grammar_accepts(grammar, call_text(fmt, "send_parcel", {"address": {"code": "14000"}}))
        assert not grammar_accepts(grammar, call_text(fmt, "send_parcel", {"address": CAEN}))
        assert not grammar_accepts(grammar, call_text(fmt, "save_person", {**ANN, "address": {"code": "1"}}))


TREE = {  # draft-07 style: `definitions`, a ref to the root, and one into the root's properties
    "name": "plant",
    "parameters": {
        "type": "object",
        "properties": {
            "label": {"type": "string", "maxLength": 3},
            "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
            "twin": {"$ref": "#/properties/label"},
            "soil": {"$ref": "#/definitions/Soil"},
        },
        "required": ["label", "soil"],
        "definitions": {"Soil": {"enum": ["clay", "sand"]}},
    },
}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_refs_to_the_root_and_its_properties_follow_the_parameters(fmt: ToolFormat) -> None:
    grammar = fmt.grammar([TREE], "plant")
    leaf = {"label": "b", "soil": "sand"}
    assert grammar_accepts(
        grammar, call_text(fmt, "plant", {"label": "a", "children": [leaf], "soil": "clay"})
    )
    assert grammar_accepts(grammar, call_text(fmt, "plant", {"label": "a", "twin": "bb", "soil": "clay"}))
    assert not grammar_accepts(grammar, call_text(fmt, "plant", {"label": "a", "soil": "loam"}))
    assert not grammar_accepts(grammar, call_text(fmt, "plant", {"label": "a", "twin": 3, "soil": "clay"}))
    assert not grammar_accepts(
        grammar, call_text(fmt, "plant", {"label": "a", "children": [{"label": "b"}], "soil": "clay"})
    )


@pytest.mark.parametrize(
    ("template", "name"),
    [(SMOLLM2_TEMPLATE, "save_person"), (HERMES_TEMPLATE, None), (LLAMA3_TEMPLATE, "save_person")],
)
def test_a_forced_call_of_nested_models_decodes_to_a_valid_call(template: str, name: str | None) -> None:
    engine = tiny_tool_engine(template)
    fmt = detect_tool_format(engine.tokenizer)
    messages = [{"role": "user", "content": "Save Ann, of Caen."}]
    completion = engine.complete(
        messages, tools=[SAVE], grammar=fmt.grammar([SAVE], name), max_new_tokens=400
    )
    assert completion.stats.finish_reason == "eos"
    (call,) = fmt.parse(completion.text).calls
    assert call.name == "save_person"
    Person.model_validate(call.arguments)


def test_structured_output_of_nested_models_decodes_to_a_valid_instance() -> None:
    engine = tiny_tool_engine(SMOLLM2_TEMPLATE)
    messages = [{"role": "user", "content": "Ann, of Caen."}]
    grammar = Grammar.json_schema(Person.model_json_schema())
    completion = engine.complete(messages, grammar=grammar, max_new_tokens=300)
    assert completion.stats.finish_reason == "eos"
    Person.model_validate_json(completion.text)


def test_only_refs_of_schemas_move_not_data_that_looks_like_one() -> None:
    data = {"$ref": "#/properties/a"}
    tool = {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "object", "default": data, "examples": [data]},
                "enum": {"$ref": "#/properties/a"},  # a property named as a keyword is a schema
            },
        },
    }
    arguments = LLAMA3.call_schema(check_tools([tool])[0])["properties"]["parameters"]["properties"]
    assert arguments["a"]["default"] == data and arguments["a"]["examples"] == [data]
    assert arguments["enum"] == {"$ref": "#/properties/parameters/properties/a"}
