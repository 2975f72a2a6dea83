"""Predicted Outputs: a call's ``prediction`` drafts first and never changes a token.

In process (`LookaheadEngine.stream(prediction=...)`), over HTTP (OpenAI's ``prediction`` on
``/v1/chat/completions`` and ``/v1/completions``) and through a `ServerEngine`: the answer is
plain greedy decoding's whether the prediction is right, partly right or wrong, and the usage
counts the prediction's verified draft tokens as accepted or rejected.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting.prediction import PredictionDrafter
from rag_lookahead.drafting.suffix import SuffixDrafter
from rag_lookahead.planning.costs import CostCurve
from rag_lookahead.protocol import RequestError, plan_chat, plan_completion, usage
from rag_lookahead.remote import ServerEngine
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.streaming.stats import PredictionMatch, StepRecorder
from rag_lookahead.testing import VOCAB, CharTokenizer, greedy_reference, tiny_model
from rag_lookahead.testing.local_server import WAIT_S, LiveServer, served_engine

NEW_TOKENS = 48
PROMPT = [5, 17, 33, 2, 9]
CPU_CURVE = CostCurve((1, 2, 8, 16, 64), (1.0, 1.6, 1.65, 1.9, 3.5))


def lcs(a: list[int], b: list[int]) -> int:
    """The longest common subsequence's length, by the textbook table."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal, row[0] = 0, 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def prediction_counts(predicted: list[int], answer: list[int]) -> tuple[int, int]:
    """OpenAI's counts: the prediction's tokens that appear in the answer (in order), and the
    others."""
    accepted = lcs(predicted, answer)
    return accepted, len(predicted) - accepted


def predictions(reference: list[int]) -> dict[str, list[int]]:
    """The answer itself, the answer with an edit in its middle, and unrelated tokens."""
    rng = random.Random(0)
    edit = [rng.randrange(VOCAB) for _ in range(5)]
    return {
        "right": reference,
        "partly": [*reference[:12], *edit, *reference[20:]],
        "wrong": [rng.randrange(VOCAB) for _ in range(NEW_TOKENS)],
    }


# The prediction in the call's suffix drafter (the default policy), or drafting first on its own.
DRAFTING = [("trie", "suffix"), ("auto", "suffix"), ("trie", "trie"), ("jacobi", "suffix")]


@pytest.mark.parametrize(("mode", "policy"), DRAFTING)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_a_prediction_changes_no_token(family: str, mode: str, policy: str) -> None:
    model, tokenizer = tiny_model(family), CharTokenizer()
    reference = greedy_reference(model, PROMPT, NEW_TOKENS)
    for kind, predicted in predictions(reference).items():
        config = LookaheadConfig(mode=mode, draft_policy=policy)  # type: ignore[arg-type]
        engine = LookaheadEngine(model, tokenizer, config, cost_curve=CPU_CURVE)
        completion = engine.complete(
            PROMPT, max_new_tokens=NEW_TOKENS, prediction=tokenizer.decode(predicted)
        )
        assert completion.token_ids == reference, kind
        stats = completion.stats
        counts = (stats.accepted_prediction_tokens, stats.rejected_prediction_tokens)
        assert counts == prediction_counts(predicted, reference), kind  # OpenAI's, whatever drafted
        if kind != "wrong":
            # Most of the answer came from the prediction, in a few forwards.
            assert stats.accepted_prediction_tokens >= NEW_TOKENS * 2 // 3, kind
            assert stats.steps < NEW_TOKENS // 2, kind
        assert engine.trie.owners() <= {"__output__"}  # nothing of the call stays in the trie


def test_without_a_prediction_nothing_is_counted() -> None:
    model, tokenizer = tiny_model("llama"), CharTokenizer()
    engine = LookaheadEngine(model, tokenizer, LookaheadConfig(mode="trie"))
    reference = greedy_reference(model, PROMPT, NEW_TOKENS)
    stats = engine.complete(PROMPT, max_new_tokens=NEW_TOKENS, documents=[tokenizer.decode(reference)]).stats
    assert sum(stats.accepted_per_step) > 0
    assert (stats.accepted_prediction_tokens, stats.rejected_prediction_tokens) == (0, 0)
    half = reference[: NEW_TOKENS // 2]
    plain = engine.plain().complete(PROMPT, max_new_tokens=NEW_TOKENS, prediction=tokenizer.decode(half))
    # Decoding plainly, nothing drafts from the prediction; its tokens in the answer still count.
    assert plain.token_ids == reference and sum(plain.stats.accepted_per_step) == 0
    assert (plain.stats.accepted_prediction_tokens, plain.stats.rejected_prediction_tokens) == (len(half), 0)


def distrust(engine: LookaheadEngine, sources: list[str]) -> None:
    """Teach the planner that these sources' drafts are never accepted."""
    tree = DraftTree((0, 1), (-1, 0), ("root", "x"))
    for source in sources:
        rejected = DraftTree(tree.tokens, tree.parents, ("root", source))
        for _ in range(400):
            engine.planner.learn(rejected, [0])


def test_a_prediction_drafts_where_documents_are_not_trusted() -> None:
    model, tokenizer = tiny_model("llama"), CharTokenizer()
    reference = greedy_reference(model, PROMPT, NEW_TOKENS)
    text = tokenizer.decode(reference)
    engine = LookaheadEngine(model, tokenizer, LookaheadConfig(mode="auto"), cost_curve=CPU_CURVE)
    buckets = (1, 2, 3, 4, 8, 16)
    distrust(engine, [f"{kind}{n}" for kind in ("sfx", "doc", "out") for n in buckets])
    documented = engine.complete(PROMPT, max_new_tokens=NEW_TOKENS, documents=[text])
    predicted = engine.complete(PROMPT, max_new_tokens=NEW_TOKENS, prediction=text)
    assert documented.token_ids == predicted.token_ids == reference
    assert sum(documented.stats.accepted_per_step) < NEW_TOKENS // 4  # the documents barely draft
    assert predicted.stats.accepted_prediction_tokens >= NEW_TOKENS * 2 // 3


def test_a_prediction_is_text() -> None:
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="trie"))
    with pytest.raises(TypeError, match="prediction must be a string"):
        engine.stream(PROMPT, prediction=[1, 2, 3])  # type: ignore[arg-type]


def test_of_matches_as_long_the_prediction_s_drafts_first() -> None:
    drafter = SuffixDrafter([[8, 2, 3, 9, 9]], prediction=[1, 2, 3, 4, 5])
    tree = drafter.propose([7, 2, 3], 2).tree  # "2 3" matches in both texts
    assert tree.tokens[1:] == (4, 5) and tree.sources[1:] == ("pred2", "pred2")
    tree = drafter.propose([8, 2, 3], 4).tree  # a longer match in the call's own text wins
    assert tree.tokens[1] == 9 and tree.sources[1] == "sfx3"
    assert "pred2" in tree.sources  # the prediction's branch still drafts, below it


def test_the_prediction_drafter_drafts_the_prediction_alone() -> None:
    drafter = PredictionDrafter([1, 2, 3, 4, 5, 6])
    tree = drafter.propose([9, 2, 3], 8).tree
    assert tree.tokens == (3, 4, 5, 6) and set(tree.sources[1:]) == {"pred2"}
    drafter.observe([4, 7, 7])  # the output is not the prediction
    assert drafter.propose([4, 7], 8).tree.tokens == (7,)


@pytest.mark.parametrize("vocabulary", [2, 5, 40])
def test_a_prediction_match_is_the_longest_common_subsequence(vocabulary: int) -> None:
    rng = random.Random(vocabulary)
    for _ in range(40):
        predicted = [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 70))]
        answer = [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 50))]
        match = PredictionMatch(predicted)
        cut = rng.randrange(0, len(answer) + 1)
        match.extend(answer[:cut])  # as the answer's steps come
        match.extend(answer[cut:])
        assert (match.size, match.matched) == (len(predicted), lcs(predicted, answer))


def test_the_recorder_counts_the_prediction_in_the_tokens_released() -> None:
    recorder = StepRecorder(prompt_tokens=3, prediction=PredictionMatch([4, 5, 6, 7, 8]))
    recorder.released([4])  # the prefill's token
    recorder.step(5, 3, "pred4")
    recorder.released([9, 6])  # a stop string cut the step after its second token
    stats = recorder.stats()
    assert (stats.new_tokens, stats.accepted_prediction_tokens, stats.rejected_prediction_tokens) == (3, 2, 3)
    recorder.released([7, 8, 5])  # 5 came too late: 7 and 8 are the longer match
    stats = recorder.stats()
    assert (stats.accepted_prediction_tokens, stats.rejected_prediction_tokens) == (4, 1)
    assert StepRecorder(prompt_tokens=3).stats().accepted_prediction_tokens == 0  # no prediction


# ---------------------------------------------------------------------------- the request


def test_a_request_s_prediction_is_its_text() -> None:
    text = {"prompt": "abc", "prediction": {"type": "content", "content": "def f(): pass"}}
    assert plan_completion(text).prediction == "def f(): pass"
    parts = [{"type": "text", "text": "def f"}, {"type": "text", "text": "(): pass"}]
    in_parts = {"prompt": "abc", "prediction": {"type": "content", "content": parts}}
    assert plan_completion(in_parts).prediction == "def f(): pass"
    plan = plan_completion({"prompt": "abc", "prediction": {"type": "content", "content": ""}})
    assert plan.prediction is None and "prediction" not in plan.stream_kwargs()
    assert plan_completion(text).stream_kwargs()["prediction"] == "def f(): pass"
    chat = plan_chat(
        {"messages": [{"role": "user", "content": "hi"}], "prediction": text["prediction"]}, served_engine()
    )
    assert chat.prediction == "def f(): pass"


@pytest.mark.parametrize(
    ("prediction", "param"),
    [
        ("def f(): pass", "prediction"),
        ({"type": "text", "content": "x"}, "prediction"),
        ({"type": "content", "content": "x", "extra": 1}, "prediction"),
        ({"type": "content", "content": [{"type": "image_url", "image_url": "x"}]}, "prediction.content[0]"),
        ({"type": "content", "content": 7}, "prediction.content"),
    ],
)
def test_a_bad_prediction_is_refused_naming_it(prediction: object, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        plan_completion({"prompt": "abc", "prediction": prediction})
    assert caught.value.param == param


def test_the_usage_carries_the_prediction_s_counts() -> None:
    recorder = StepRecorder(prompt_tokens=3, prediction=PredictionMatch([1, 2]))
    recorder.released([1, 3])
    details = usage(recorder.stats())["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": 1, "rejected_prediction_tokens": 1}


# ---------------------------------------------------------------------------- over HTTP

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Rewrite: the normans were the people of normandy."}]
N = 24


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return served_engine()


@pytest.fixture(scope="module")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    server = LiveServer(create_app(engine, ServeSettings(model_name=MODEL)))
    yield server
    server.stop()


def test_chat_and_completions_take_openai_s_prediction(live: LiveServer, engine: LookaheadEngine) -> None:
    client = live.client()
    expected = engine.plain().complete(MESSAGES, max_new_tokens=N).text
    prediction = {"type": "content", "content": [{"type": "text", "text": expected}]}
    out = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=N,
        temperature=0,
        prediction=prediction,  # type: ignore[arg-type]
    )
    assert out.choices[0].message.content == expected
    details = out.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.accepted_prediction_tokens >= N // 2
    assert details.rejected_prediction_tokens is not None
    prompt = "The Normans were"
    plain = engine.plain().complete(prompt, max_new_tokens=N).text
    streamed = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=N,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"prediction": {"type": "content", "content": plain}},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain
    last = chunks[-1].usage
    assert last is not None and last.completion_tokens_details is not None
    assert last.completion_tokens_details.accepted_prediction_tokens >= N // 2


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def stop_in(text: str) -> dict[str, Any]:
    """A stop string the answer ``text`` meets in its second half."""
    return {"stop": [text[len(text) // 2 : len(text) // 2 + 3]]}


# (case, route, the request's keys given the plain answer's text): each asked whole and streamed
PREDICTION_USAGE_CASES: list[tuple[str, str, Callable[[str], dict[str, Any]]]] = [
    ("greedy", COMPLETIONS, lambda text: {"temperature": 0}),
    ("sampling", COMPLETIONS, lambda text: {"temperature": 1.0, "seed": 7}),
    ("a stop string", COMPLETIONS, lambda text: {"temperature": 0, **stop_in(text)}),
    ("a max_tokens cut", COMPLETIONS, lambda text: {"temperature": 0, "max_tokens": N // 3}),
    ("chat, greedy", CHAT, lambda text: {"temperature": 0}),
    ("chat, sampled, a stop string", CHAT, lambda text: {"temperature": 0.8, "seed": 3, **stop_in(text)}),
]


def streamed_chunks(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of ``body`` asked streamed, with its usage last."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url, json=body, timeout=WAIT_S) as out:
        return [json.loads(line[6:]) for line in out.iter_lines() if line.startswith("data: {")]


def answer_text(reply: dict[str, Any], chunks: list[dict[str, Any]]) -> tuple[str, str]:
    """The whole reply's text and the streamed one's."""
    choice = reply["choices"][0]
    if "message" in choice:
        deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
        return choice["message"]["content"] or "", "".join(deltas)
    return choice["text"], "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


@pytest.mark.parametrize(
    ("case", "route", "keys"), PREDICTION_USAGE_CASES, ids=[c[0] for c in PREDICTION_USAGE_CASES]
)
def test_prediction_usage_is_openai_s_and_the_same_streamed_or_whole(
    live: LiveServer, engine: LookaheadEngine, case: str, route: str, keys: Callable[[str], dict[str, Any]]
) -> None:
    """``accepted_prediction_tokens`` are the prediction's tokens that appear in the answer (in
    order), ``rejected_prediction_tokens`` the others: together the prediction's tokens, the
    accepted ones at most the answer's; and the usage streamed is the usage whole."""
    prompt: dict[str, Any] = {"messages": MESSAGES} if route == CHAT else {"prompt": "The Normans were"}
    text = engine.plain().complete(prompt.get("prompt") or MESSAGES, max_new_tokens=N).text
    prediction = text[:6] + "#%&" + text[9:] + " and more than the answer"  # an edit, a tail
    body = {"model": MODEL, **prompt, "max_tokens": N, **keys(text)}
    body["prediction"] = {"type": "content", "content": prediction}
    url = f"{live.url}{route}"
    assert httpx.post(url, json=body, timeout=WAIT_S).status_code == 200  # the prompt now cached, for both
    whole = httpx.post(url, json=body, timeout=WAIT_S).json()
    chunks = streamed_chunks(url, body)
    assert answer_text(whole, chunks)[0] == answer_text(whole, chunks)[1]
    used, streamed = whole["usage"], chunks[-1]["usage"]
    used.pop("lookahead"), streamed.pop("lookahead")  # how it was drafted: each call its own
    assert streamed == used
    details = used["completion_tokens_details"]
    accepted, rejected = details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]
    assert accepted + rejected == len(engine.tokenizer(prediction, add_special_tokens=False).input_ids)
    assert 0 < accepted <= used["completion_tokens"] and rejected > 0


def test_a_bad_prediction_is_400(live: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        live.client().chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=N,
            prediction={"type": "content", "content": 7},  # type: ignore[typeddict-item]
        )
    assert caught.value.body["param"] == "prediction.content"  # type: ignore[index]


def test_a_server_engine_sends_the_prediction_and_reads_its_counts(
    live: LiveServer, engine: LookaheadEngine
) -> None:
    expected = engine.plain().complete(MESSAGES, max_new_tokens=N).text
    remote = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0)
    completion = remote.complete(MESSAGES, max_new_tokens=N, prediction=expected)
    assert completion.text == expected
    assert completion.stats.accepted_prediction_tokens >= N // 2
    vllm = ServerEngine(live.base_url, MODEL, "vllm", max_retries=0)
    with pytest.raises(ValueError, match="no predicted outputs"):
        vllm.stream(MESSAGES, max_new_tokens=N, prediction=expected)
