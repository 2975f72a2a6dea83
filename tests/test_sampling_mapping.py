"""OpenAI's sampling options ↔ `GenerationParams`: one module, both directions, and
"temperature 0 is greedy" said once."""

from __future__ import annotations

from typing import Any

import pytest

from rag_lookahead.config import GenerationParams, is_greedy
from rag_lookahead.protocol import RequestError, openai_to_params, params_to_openai

DEFAULTS = GenerationParams()


def there_and_back(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """``body`` read as params and written back as one request body (extras merged)."""
    fields, extra = params_to_openai(openai_to_params(body, DEFAULTS, None, chat=chat), chat=chat)
    return {**fields, **extra}


@pytest.mark.parametrize("temperature", [0, 0.0])
def test_temperature_zero_comes_in_greedy_and_goes_out_as_zero(temperature: float) -> None:
    params = openai_to_params({"temperature": temperature, "top_p": 0.5}, DEFAULTS, None, chat=True)
    assert (params.do_sample, params.temperature, params.sampling) == (False, 1.0, False)
    body = there_and_back({"temperature": temperature, "top_p": 0.5, "top_k": 3}, chat=True)
    assert body == {"max_tokens": DEFAULTS.max_new_tokens, "temperature": 0.0}  # top_p, top_k: sampling's


@pytest.mark.parametrize(
    ("body", "chat"),
    [
        ({"max_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 3}, True),
        ({"max_tokens": 5, "temperature": 2.0, "repetition_penalty": 1.1, "stop": ["\n", "##"]}, False),
        ({"max_tokens": 4, "temperature": 0.0, "seed": 2**64 - 1, "logprobs": True, "top_logprobs": 3}, True),
        ({"max_tokens": 4, "temperature": 0.5, "logprobs": 2}, False),  # the legacy completion's
        ({"max_tokens": 4, "temperature": 0.0, "logprobs": 0}, False),
    ],
)
def test_a_request_comes_back_as_it_went(body: dict[str, Any], chat: bool) -> None:
    assert there_and_back(body, chat=chat) == body


def test_params_come_back_as_they_went() -> None:
    params = GenerationParams(
        max_new_tokens=9,
        do_sample=True,
        temperature=0.3,
        top_p=0.8,
        top_k=4,
        repetition_penalty=1.2,
        stop_strings=("x",),
        seed=1,
        logprobs=True,
        top_logprobs=2,
    )
    for chat in (True, False):
        fields, extra = params_to_openai(params, chat=chat)
        assert openai_to_params({**fields, **extra}, DEFAULTS, None, chat=chat) == params


def test_sampling_asked_for_at_temperature_zero_goes_out_greedy() -> None:
    params = GenerationParams(do_sample=True, temperature=0, top_p=0.5, top_k=3)
    assert params_to_openai(params, chat=True) == ({"max_tokens": 256, "temperature": 0.0}, {})


def test_the_rule_is_one_function() -> None:
    assert is_greedy(0) and is_greedy(0.0) and not is_greedy(1e-6)
    assert GenerationParams(do_sample=True, temperature=0.1).sampling
    assert not GenerationParams(do_sample=True, temperature=0.0).sampling


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"n": 2}, "n"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_a_bad_value_names_its_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        openai_to_params(body, DEFAULTS, None, chat=True)
    assert info.value.param == param
