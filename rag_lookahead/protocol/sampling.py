"""OpenAI's sampling options ↔ `GenerationParams`, both directions in one place.

In (`openai_to_params`): a request's ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``repetition_penalty``, ``seed``, ``stop``, ``n``, ``logprobs``, ``top_logprobs`` and
``logit_bias``, each checked and read as a field of `GenerationParams`, or a `RequestError`
naming the parameter.
Out (`params_to_openai`): `GenerationParams` as a request's fields again, OpenAI's own and
those beyond its API that vLLM, SGLang and ``rag-lookahead serve`` take as extra fields.

Temperature 0 is greedy (`is_greedy`) both ways: it comes in as transformers' pair
``do_sample=False`` and goes out as ``temperature: 0.0``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rag_lookahead.config import GenerationParams, is_greedy
from rag_lookahead.protocol.errors import RequestError, checked_text
from rag_lookahead.streaming.logprobs import MAX_TOP_LOGPROBS
from rag_lookahead.structured import Grammar

__all__ = ["MAX_STOP_STRINGS", "openai_to_params", "params_to_openai"]

# Each stop string is searched for at every step: a bound keeps that cost a request's own.
MAX_STOP_STRINGS = 16
# A token id as JSON writes a ``logit_bias`` key: decimal, no sign, no leading zero, no spaces
# (so no two keys name one token), and short enough to be read as an integer at once.
_TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,17}")


# ---------------------------------------------------------------------------- in


def openai_to_params(
    body: Mapping[str, Any], defaults: GenerationParams, grammar: Grammar | None, *, chat: bool
) -> GenerationParams:
    """``defaults`` with what ``body`` (a request's known keys) sets, and ``grammar``; a chat's
    ``logprobs`` is true or false, a completion's may be an integer too (OpenAI's legacy API)."""
    max_tokens = _max_tokens(body.get("max_tokens"), body.get("max_completion_tokens"))
    fields: dict[str, Any] = {"grammar": grammar, **_logprobs(body, chat, defaults.logprobs)}
    if max_tokens is not None:
        fields["max_new_tokens"] = max_tokens
    if "temperature" in body:
        fields.update(_temperature(_number(body["temperature"], "temperature", 0.0, 2.0)))
    if "top_p" in body:
        fields["top_p"] = _number(body["top_p"], "top_p", 0.0, 1.0, open_low=True)
    if "top_k" in body:
        fields["top_k"] = _integer(body["top_k"], "top_k", 1)
    if "repetition_penalty" in body:
        fields["repetition_penalty"] = _number(
            body["repetition_penalty"], "repetition_penalty", 0.0, None, open_low=True
        )
    if "seed" in body:
        fields["seed"] = _integer(body["seed"], "seed", 0, 2**64 - 1)
    if "stop" in body:
        fields["stop_strings"] = _stops(body["stop"])  # a request's stops replace the defaults
    if "logit_bias" in body:
        fields["logit_bias"] = _logit_bias(body["logit_bias"])
    _check_n(body.get("n"))
    try:
        return replace(defaults, **fields)
    except (TypeError, ValueError) as err:
        raise RequestError(str(err)) from None


def _temperature(temperature: float) -> dict[str, Any]:
    """OpenAI's one ``temperature`` as transformers' pair; greedy keeps the default temperature,
    which transformers would otherwise warn is unused."""
    if is_greedy(temperature):
        return {"do_sample": False, "temperature": 1.0}
    return {"do_sample": True, "temperature": temperature}


def _logprobs(body: Mapping[str, Any], chat: bool, default: bool) -> dict[str, Any]:
    """``logprobs`` (true or false) and ``top_logprobs`` (0 to 20), as OpenAI's chat takes them;
    a completion's ``logprobs`` may also be an integer, OpenAI's legacy API: that many top tokens."""
    fields: dict[str, Any] = {}
    logprobs = body.get("logprobs")
    if not chat and isinstance(logprobs, int) and not isinstance(logprobs, bool):
        if "top_logprobs" in body:
            raise RequestError(
                "a completion's integer logprobs is its top_logprobs: give one", "top_logprobs"
            )
        fields["logprobs"], fields["top_logprobs"] = True, _integer(logprobs, "logprobs", 0, MAX_TOP_LOGPROBS)
    elif logprobs is not None:
        if not isinstance(logprobs, bool):
            kinds = "true or false" if chat else "true, false or an integer"
            raise RequestError(f"logprobs is {kinds}, got {logprobs!r}", "logprobs")
        fields["logprobs"] = logprobs
    if "top_logprobs" in body:
        fields["top_logprobs"] = _integer(body["top_logprobs"], "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if fields["top_logprobs"] and not fields.get("logprobs", default):
            raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
    elif fields.get("logprobs") is False:
        fields["top_logprobs"] = 0  # over a default that asks for them
    return fields


def _max_tokens(max_tokens: object, max_completion_tokens: object) -> int | None:
    values = {
        name: _integer(value, name, 1)
        for name, value in (("max_tokens", max_tokens), ("max_completion_tokens", max_completion_tokens))
        if value is not None
    }
    if len(set(values.values())) > 1:
        raise RequestError(
            "max_tokens and max_completion_tokens disagree: give one of them", "max_completion_tokens"
        )
    return next(iter(values.values()), None)


def _number(value: object, name: str, low: float, high: float | None, *, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    too_low = value <= low if open_low else value < low
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if open_low else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"
        raise RequestError(f"{name} must be in {bounds}, got {value}", name)
    return float(value)


def _integer(value: object, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} is an integer, got {value!r}", name)
    if value < low or (high is not None and value > high):
        raise RequestError(
            f"{name} must be from {low} to {high if high is not None else 'any'}, got {value}", name
        )
    return value


def _stops(value: object) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop is a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    return tuple(checked_text(stop, "stop") for stop in stops)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``, token ids (as JSON's strings, or a front end's integers) to
    biases from -100 to 100, as `GenerationParams` keeps it; ``{}`` is no bias."""
    if not isinstance(value, Mapping):
        raise RequestError(
            f"logit_bias maps token ids to biases from -100 to 100, got {type(value).__name__}", "logit_bias"
        )
    pairs: dict[int, Any] = {}  # the biases are checked by `GenerationParams`
    for key, bias in value.items():
        if isinstance(key, str) and _TOKEN_ID.fullmatch(key):
            token = int(key)
        elif isinstance(key, int) and not isinstance(key, bool) and key >= 0:
            token = key
        else:
            raise RequestError(f'logit_bias keys are token ids such as "50256", got {key!r}', "logit_bias")
        if token in pairs:
            raise RequestError(f"logit_bias names token id {token} twice", "logit_bias")
        pairs[token] = bias
    try:
        return GenerationParams(logit_bias=tuple(pairs.items())).logit_bias
    except ValueError as err:
        raise RequestError(str(err), "logit_bias") from None


def _check_n(value: object) -> None:
    if value is not None and (isinstance(value, bool) or value != 1):
        raise RequestError(f"n={value!r} is not supported: one choice per request", "n", "unsupported_value")


# ---------------------------------------------------------------------------- out


def params_to_openai(params: GenerationParams, *, chat: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """``params`` as a request's fields: OpenAI's own, and the extra ones beyond its API
    (``top_k``, ``repetition_penalty``). A greedy call sends no ``top_p`` or ``top_k``, which
    only sampling reads. ``eos_token_id`` and ``grammar`` have no OpenAI field: how a server
    takes them is its client's business."""
    fields: dict[str, Any] = {"max_tokens": params.max_new_tokens}
    extra: dict[str, Any] = {}
    if params.sampling:
        fields["temperature"] = params.temperature
        if params.top_p != 1.0:
            fields["top_p"] = params.top_p
        if params.top_k is not None:
            extra["top_k"] = params.top_k
    else:
        fields["temperature"] = 0.0  # greedy on vLLM, SGLang and OpenAI alike
    if params.repetition_penalty != 1.0:
        extra["repetition_penalty"] = params.repetition_penalty
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stop_strings:
        fields["stop"] = list(params.stop_strings)
    if params.logit_bias:
        # Whole biases as integers: OpenAI's API types them so.
        fields["logit_bias"] = {str(t): int(b) if b.is_integer() else b for t, b in params.logit_bias}
    return {**fields, **_logprobs_out(params, chat)}, extra


def _logprobs_out(params: GenerationParams, chat: bool) -> dict[str, Any]:
    """The log-probability fields: OpenAI's chat ones, or the legacy completion's ``logprobs: k``."""
    if not params.logprobs:
        return {}
    if chat:
        return {"logprobs": True, "top_logprobs": params.top_logprobs}
    return {"logprobs": params.top_logprobs}
