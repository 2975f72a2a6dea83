"""``echo`` with prompt log probabilities on ``/v1/completions``, and the engine's scoring.

Every prompt token's log probability is the model's own log-softmax at the position before it
(an independent forward through the Hugging Face model), the first ``null``; lm-eval's
``local-completions`` loglikelihood request reads its continuation's sum and greediness off the
reply; an echo followed by generation is the prompt, then the plain answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.engine.scoring import SCORE_CHUNK, score_tokens
from rag_lookahead.protocol import RequestError, plan_completion
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.testing.local_server import LiveServer, error_of, served_engine

MODEL = "tiny"
PROMPT = "The Normans were the people who gave their name to Normandy."
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


def reference(engine: LookaheadEngine, ids: list[int]) -> torch.Tensor:
    """The model's log-softmax at every position of ``ids``, by a plain Hugging Face forward."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([ids])).logits[0]  # [n, V]
    return torch.log_softmax(logits.float(), dim=-1)  # [n, V]


def post(engine: Any, body: dict[str, Any], path: str = "/v1/completions") -> httpx.Response:
    app = create_app(engine, ServeSettings(model_name=MODEL))

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post(path, json=body)

    return asyncio.run(send())


def completion(engine: Any, **body: Any) -> dict[str, Any]:
    response = post(engine, {"model": MODEL, **body})
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


# ---------------------------------------------------------------------------- the engine


def test_prompt_logprobs_are_the_model_s_log_softmax(engine: LookaheadEngine) -> None:
    text = (PROMPT * 6)[: SCORE_CHUNK + 60]  # more than one chunk
    ids = engine.encode(text)
    scored = engine.prompt_logprobs(text, 3)
    logp = reference(engine, ids)
    assert scored.token_ids == tuple(ids) and scored.first_token == text[0]
    assert len(scored.logprobs) == len(ids) - 1
    for position, item in enumerate(scored.logprobs, start=1):
        row = logp[position - 1]
        assert item.token_id == ids[position] and item.token == text[position]
        assert abs(item.logprob - row[ids[position]].item()) < TOLERANCE
        values, best = row.topk(3)
        assert [t.token_id for t in item.top_logprobs] == best.tolist()
        assert all(
            abs(t.logprob - v) < TOLERANCE for t, v in zip(item.top_logprobs, values.tolist(), strict=True)
        )


def test_chunks_change_nothing(engine: LookaheadEngine) -> None:
    ids = engine.encode(PROMPT)
    whole = engine.runner.thread.call(lambda: score_tokens(engine.runner, ids, 2))
    chunked = engine.runner.thread.call(lambda: score_tokens(engine.runner, ids, 2, chunk=5))
    assert [t for t, _ in whole[1][0]] == [t for t, _ in chunked[1][0]]
    assert max(abs(a - b) for a, b in zip(whole[0], chunked[0], strict=True)) < TOLERANCE


def test_a_one_token_prompt_has_only_its_null(engine: LookaheadEngine) -> None:
    scored = engine.prompt_logprobs("T", 2)
    assert (scored.first_token, scored.logprobs) == ("T", ())


@pytest.mark.parametrize(
    ("prompt", "top"), [("", 0), (PROMPT, 21), (PROMPT, -1), ("x" * 600, 0), ([10**6], 0)]
)
def test_the_engine_refuses_bad_scoring(engine: LookaheadEngine, prompt: Any, top: int) -> None:
    with pytest.raises(ValueError):
        engine.prompt_logprobs(prompt, top)


# ---------------------------------------------------------------------------- the route


def test_echo_with_max_tokens_0_is_the_prompt_scored(engine: LookaheadEngine) -> None:
    reply = completion(engine, prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
    (choice,) = reply["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert reply["usage"]["prompt_tokens"] == len(PROMPT) and reply["usage"]["completion_tokens"] == 0
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == list(PROMPT)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["text_offset"] == list(range(len(PROMPT)))
    logp = reference(engine, engine.encode(PROMPT))
    for position in range(1, len(PROMPT)):
        expected = logp[position - 1, engine.encode(PROMPT)[position]].item()
        assert abs(logprobs["token_logprobs"][position] - expected) < TOLERANCE
        top = logprobs["top_logprobs"][position]
        assert PROMPT[position] in top and len(top) in (2, 3)  # the two best, and the token's own


def test_lm_eval_loglikelihood_request(engine: LookaheadEngine) -> None:
    """lm-eval's ``local-completions`` loglikelihood payload (token ids, a batch of one), read
    as its ``parse_logprobs`` reads the reply."""
    context, continuation = engine.encode("The Normans were "), engine.encode("the people")
    ids = context + continuation
    payload = {"prompt": [ids], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    choice = completion(engine, **payload)["choices"][0]
    ctxlen = len(context)
    token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    is_greedy = all(lp == max(top.values()) for lp, top in zip(token_logprobs, top_logprobs, strict=True))

    logp = reference(engine, ids)
    rows = logp[ctxlen - 1 : len(ids) - 1]  # [len(continuation), V]
    expected = rows.gather(1, torch.tensor(continuation).unsqueeze(1)).sum().item()
    assert abs(sum(token_logprobs) - expected) < len(continuation) * TOLERANCE
    assert is_greedy == (rows.argmax(-1).tolist() == continuation)
    # The one generated token follows the prompt's, as a plain call gives it.
    plain = completion(engine, prompt=ids, temperature=0, max_tokens=1, logprobs=1)["choices"][0]
    assert choice["text"] == "The Normans were the people" + plain["text"]
    assert choice["logprobs"]["tokens"][-1] == plain["logprobs"]["tokens"][0]
    # (Equal within rounding: the second call may reuse the first's cached prefix.)
    assert abs(choice["logprobs"]["token_logprobs"][-1] - plain["logprobs"]["token_logprobs"][0]) < TOLERANCE


def test_echo_then_the_plain_answer(engine: LookaheadEngine) -> None:
    plain = completion(engine, prompt=PROMPT, max_tokens=6, logprobs=1)["choices"][0]
    echoed = completion(engine, prompt=PROMPT, max_tokens=6, logprobs=1, echo=True)["choices"][0]
    assert echoed["text"] == PROMPT + plain["text"]
    assert echoed["finish_reason"] == plain["finish_reason"]
    n = len(PROMPT)
    answer = echoed["logprobs"]
    assert answer["tokens"][n:] == plain["logprobs"]["tokens"]
    assert answer["token_logprobs"][n:] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=TOLERANCE)
    for top, expected in zip(answer["top_logprobs"][n:], plain["logprobs"]["top_logprobs"], strict=True):
        assert top == pytest.approx(expected, abs=TOLERANCE)
    assert answer["text_offset"][n:] == [n + offset for offset in plain["logprobs"]["text_offset"]]


def test_echo_without_logprobs_is_the_text_alone(engine: LookaheadEngine) -> None:
    reply = completion(engine, prompt=PROMPT, echo=True, max_tokens=0)
    assert reply["choices"][0]["text"] == PROMPT and reply["choices"][0]["logprobs"] is None
    assert reply["usage"]["prompt_tokens"] == len(PROMPT)
    ids = completion(engine, prompt=[40, 41, 42], echo=True, max_tokens=0)["choices"][0]
    assert ids["text"] == "HIJ"


def test_the_openai_client_echoes(engine: LookaheadEngine) -> None:
    with LiveServer(create_app(engine, ServeSettings(model_name=MODEL))) as live:
        out = live.client().completions.create(
            model=MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0
        )
    assert out.choices[0].text == PROMPT and out.choices[0].logprobs is not None
    assert out.choices[0].logprobs.token_logprobs is not None
    assert out.choices[0].logprobs.token_logprobs[0] is None


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": PROMPT, "echo": "yes"}, 400, "echo"),
        ({"prompt": PROMPT, "echo": True, "stream": True}, 400, "echo"),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": PROMPT, "echo": True, "max_tokens": -1}, 400, "max_tokens"),
        ({"prompt": PROMPT, "echo": True, "max_tokens": False}, 400, "max_tokens"),
        ({"prompt": PROMPT, "echo": True, "logprobs": 21, "max_tokens": 0}, 400, "logprobs"),
        ({"prompt": PROMPT, "echo": True, "logprobs": True, "max_tokens": 0}, 400, "logprobs"),  # chat's form
        ({"prompt": PROMPT, "echo": True, "logprobs": False, "max_tokens": 0}, 400, "logprobs"),
        ({"prompt": [10**6, 3], "echo": True, "logprobs": 1, "max_tokens": 0}, 400, "prompt"),
        ({"prompt": [10**6, 3], "echo": True, "max_tokens": 0}, 400, "prompt"),
        ({"prompt": "x" * 600, "echo": True, "logprobs": 1, "max_tokens": 0}, 400, "prompt"),
        ({"prompt": [[1, 2], [3, 4]], "echo": True, "max_tokens": 0}, 400, "prompt"),
        ({"prompt": PROMPT, "echo": True, "model": "other", "max_tokens": 0}, 404, "model"),
    ],
)
def test_hostile_echo_requests(
    engine: LookaheadEngine, body: dict[str, Any], status: int, param: str
) -> None:
    assert error_of(post(engine, {"model": MODEL, **body}), status)["param"] == param


def test_chat_has_no_echo(engine: LookaheadEngine) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "echo": True}
    assert error_of(post(engine, body, "/v1/chat/completions"), 400)["param"] == "echo"


class _Remote:
    """``engine`` without `prompt_logprobs`, as a remote server's engine is."""

    def __init__(self, engine: LookaheadEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        if name == "prompt_logprobs":
            raise AttributeError(name)
        return getattr(self._engine, name)


def test_echo_with_logprobs_needs_a_local_engine(engine: LookaheadEngine) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}
    error = error_of(post(_Remote(engine), body), 400)
    assert error["param"] == "echo" and "local engine" in error["message"]
    assert completion(_Remote(engine), prompt=PROMPT, echo=True, max_tokens=0)["choices"][0]["text"] == PROMPT


def test_plans_read_echo() -> None:
    plan = plan_completion({"prompt": "x", "echo": True, "max_tokens": 0})
    assert (plan.echo, plan.echo_only) == (True, True)
    plan = plan_completion({"prompt": "x", "echo": True, "max_tokens": 2})
    assert (plan.echo, plan.echo_only, plan.params.max_new_tokens) == (True, False, 2)
    assert not plan_completion({"prompt": "x", "echo": False}).echo
    with pytest.raises(RequestError):
        plan_completion({"prompt": "x", "echo": 1})
