"""The real default model (SmolLM2-135M-Instruct): equivalence where its behaviour matters."""

import json
from importlib import resources

import pytest
import torch
from safetensors import safe_open
from transformers import TextStreamer

from rag_lookahead import LookaheadEngine, rag_messages
from rag_lookahead.bench.run import load_records
from rag_lookahead.cli import main
from rag_lookahead.models import default_model_dir, load_model

pytestmark = pytest.mark.slow
SAMPLE = resources.files("rag_lookahead") / "data" / "sample.jsonl"


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    torch.set_num_threads(2)
    try:
        return LookaheadEngine.from_pretrained()
    finally:
        torch.set_num_threads(1)


@pytest.fixture(scope="module")
def records() -> list[dict[str, str]]:
    with resources.as_file(SAMPLE) as path:
        return load_records(path)


def reference(engine: LookaheadEngine, ids: list[int], **kwargs) -> list[int]:
    input_ids = torch.tensor([ids])
    out = engine.model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, **kwargs
    )
    return out[0, len(ids) :].tolist()


def test_rag_answers_equal_greedy_and_draft_from_the_context(engine, records) -> None:
    accepted = 0
    for record in records:
        messages = rag_messages(record["question"], record["context"])
        ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        completion = engine.complete(messages, max_new_tokens=48)
        assert completion.token_ids == reference(engine, ids, max_new_tokens=48)
        assert completion.text == engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        accepted += sum(completion.stats.accepted_per_step)
    assert accepted > 0


def test_documents_passed_per_call_are_used_and_released(engine) -> None:
    document = "The quick brown fox jumps over the lazy dog near the riverbank at dawn."
    messages = [{"role": "user", "content": "Repeat exactly: " + document}]
    completion = engine.complete(messages, max_new_tokens=24, documents=[document])
    assert "quick brown fox" in completion.text
    per_forward = completion.stats.tokens_per_step  # tokens, not time: drafts were accepted
    assert per_forward > 1.5
    assert engine.trie.owners() <= {"__output__"}


def test_drop_in_generate_returns_what_model_generate_returns(engine) -> None:
    tok = engine.tokenizer
    tok.padding_side = "left"
    texts = ["The capital of France is", "List three colours of the rainbow:"]
    batch = tok(texts, return_tensors="pt", padding=True)
    kwargs = {"max_new_tokens": 20, "do_sample": False, "stop_strings": ["\n\n"], "tokenizer": tok}
    want = engine.model.generate(**batch, **kwargs)
    got = engine.generate(**batch, **kwargs)
    assert torch.equal(got, want)
    # Greedy with a repetition penalty and an explicit EOS, single row, with a streamer.
    single = tok(["Once upon a time"], return_tensors="pt")
    kwargs = {"max_new_tokens": 24, "do_sample": False, "repetition_penalty": 1.3, "eos_token_id": 13}
    assert torch.equal(engine.generate(**single, **kwargs), engine.model.generate(**single, **kwargs))


def test_streamer_receives_the_same_text(engine, capsys) -> None:
    single = engine.tokenizer(["Once upon a time"], return_tensors="pt")
    out = engine.generate(
        **single, max_new_tokens=16, streamer=TextStreamer(engine.tokenizer, skip_prompt=True)
    )
    printed = capsys.readouterr().out
    new_text = engine.tokenizer.decode(out[0, single["input_ids"].shape[1] :], skip_special_tokens=True)
    assert printed.strip() == new_text.strip()


def test_generate_rejects_unknown_arguments(engine) -> None:
    with pytest.raises(TypeError, match="num_beams"):
        engine.generate(torch.tensor([[1, 2]]), num_beams=4)


def test_default_model_is_converted_once(engine) -> None:
    first = default_model_dir()
    assert (first / "model.safetensors").is_file() and default_model_dir() == first


def test_default_model_is_saved_in_the_standard_layout(engine) -> None:
    # Other loaders (vLLM) tie the head to the embeddings by name and pick the class by
    # `architectures`: without both, vLLM served only <|endoftext|>.
    directory = default_model_dir()
    with safe_open(str(directory / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        assert weights.metadata() == {"format": "pt"}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert "quantization_config" not in config
    model = engine.model
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_unknown_models_are_clear_errors() -> None:
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_model("/nonexistent/model/dir")
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_model("no-such-org/no-such-model-xyz")


def test_bench_cli_writes_the_documented_json(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    with resources.as_file(SAMPLE) as path:
        code = main(
            ["bench", "--data", str(path), "--limit", "2", "--max-new-tokens", "8", "--json", str(out)]
        )
    assert code == 0
    summary = json.loads(out.read_text())
    assert {"model", "device", "dtype", "records", "max_new_tokens", "methods"} <= summary.keys()
    assert summary["records"] == 2 and summary["max_new_tokens"] == 8
    assert set(summary["methods"]) == {"greedy", "prompt_lookup", "lookahead"}
    documented = {
        "seconds",
        "new_tokens",
        "tokens_per_s",
        "identical_to_greedy",
        "mean_accepted_per_step",
        "speedup_vs_greedy",
        "speedup_vs_prompt_lookup",
    }
    for m in summary["methods"].values():
        assert documented <= m.keys()
        assert m["identical_to_greedy"] == 2
    assert summary["methods"]["lookahead"]["mean_accepted_per_step"] >= 1.0
    relative = summary["cost_curve"]  # forward cost by draft size, relative to one token
    assert relative["1"] == 1.0 and all(v > 0 for v in relative.values())
    assert "lookahead" in capsys.readouterr().out


def test_bench_can_force_engine_modes_and_plot(tmp_path) -> None:
    out, chart = tmp_path / "modes.json", tmp_path / "modes.png"
    with resources.as_file(SAMPLE) as path:
        args = ["bench", "--data", str(path), "--limit", "1", "--max-new-tokens", "6", "--json", str(out)]
        assert main([*args, "--methods", "trie,jacobi,auto", "--plot", str(chart)]) == 0
        assert main([*args, "--methods", "trie,beam"]) == 2
    methods = json.loads(out.read_text())["methods"]
    assert set(methods) == {"greedy", "trie", "jacobi", "auto"}
    assert all(m["identical_to_greedy"] == 1 for m in methods.values())
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys) -> None:
    missing = tmp_path / "missing.jsonl"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["bench", "--data", str(missing)]) == 2
    assert main(["bench", "--data", str(empty)]) == 2
    assert "error" in capsys.readouterr().err
