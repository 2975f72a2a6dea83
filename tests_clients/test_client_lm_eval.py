"""lm-eval (unmodified) against the local server on 127.0.0.1 through ``local-completions``,
on two tasks of local data (lm_eval_tasks/): a ``generate_until`` task, whose answers are the
in-process engine's greedy ones to the same prompt ids, and a multiple-choice task, whose
loglikelihood requests (``echo`` with prompt logprobs) score each choice as the model's own
log-softmax does (a plain Hugging Face forward), greediness included.

lm-eval tokenizes on its side (``tokenizer_backend=huggingface``): the served tokenizer,
saved to a directory. Nothing is downloaded: the data are JSON files, the metrics lm-eval's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is installed by `make test-clients`")

import torch  # noqa: E402
from client_support import MODEL  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from rag_lookahead import LookaheadEngine  # noqa: E402
from rag_lookahead.testing.local_server import LiveServer  # noqa: E402

TASKS = Path(__file__).parent / "lm_eval_tasks"
GENERATE, CHOICE = "clients_generate", "clients_choice"
TOLERANCE = 1e-4  # per token: the server's prefill and a plain forward round alike, not bit for bit


@pytest.fixture(scope="module")
def samples(
    live: LiveServer, engine: LookaheadEngine, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """Each task's logged samples (prompts, requests and replies) from one lm-eval run."""
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    engine.tokenizer.save_pretrained(tokenizer)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(TASKS)  # the tasks' data_files are relative
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("datasets")))
    try:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={
                "model": MODEL,
                "base_url": f"{live.base_url}/completions",
                "tokenizer_backend": "huggingface",
                "tokenizer": str(tokenizer),
                "num_concurrent": 1,
                "max_retries": 1,
            },
            tasks=[GENERATE, CHOICE],
            task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
            log_samples=True,
            bootstrap_iters=0,
        )
    finally:
        monkeypatch.undo()
    assert results is not None
    assert set(results["results"]) == {GENERATE, CHOICE}
    return results["samples"]


def test_generate_until_is_the_engine_s_greedy_answer(
    samples: dict[str, list[dict[str, Any]]], engine: LookaheadEngine
) -> None:
    assert len(samples[GENERATE]) == 3
    for sample in samples[GENERATE]:
        ((context, gen_kwargs),) = sample["arguments"]
        assert gen_kwargs["until"] == ["."] and gen_kwargs["max_gen_toks"] == 16
        # Stopped at the first "." (where lm-eval cuts too) or the budget, as the server stops.
        expected = engine.complete(engine.encode(context), max_new_tokens=16, stop_strings=(".",)).text
        assert sample["resps"] == [[expected]]


def log_softmax(engine: LookaheadEngine, ids: list[int]) -> torch.Tensor:
    """The model's log-softmax at every position of ``ids``, by a plain Hugging Face forward."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([ids])).logits[0]  # [n, V]
    return torch.log_softmax(logits.float(), dim=-1)  # [n, V]


def test_choices_are_scored_by_the_model_s_loglikelihood(
    samples: dict[str, list[dict[str, Any]]], engine: LookaheadEngine
) -> None:
    assert len(samples[CHOICE]) == 3
    greedy_choices = []
    for sample in samples[CHOICE]:
        for (context, continuation), ((loglikelihood, greedy),) in zip(
            sample["arguments"], sample["resps"], strict=True
        ):
            context_ids, continuation_ids = engine.encode(context), engine.encode(continuation)
            logp = log_softmax(engine, context_ids + continuation_ids)
            rows = logp[len(context_ids) - 1 : -1]  # [len(continuation), V]
            expected = rows.gather(1, torch.tensor(continuation_ids).unsqueeze(1)).sum().item()
            assert loglikelihood == pytest.approx(expected, abs=len(continuation_ids) * TOLERANCE)
            assert greedy == (rows.argmax(-1).tolist() == continuation_ids)
            greedy_choices.append(greedy)
    assert greedy_choices.count(True) == 2  # the data's two greedy continuations
