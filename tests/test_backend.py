"""The `Backend` record: what an engine's forwards run on, each choice with where it came from,
printable and as JSON; chosen when the engine is built and again after the model changed; the
runner runs what it says and nothing else."""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import replace
from typing import Any

import pytest
from transformers import LlamaForCausalLM

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.runtime.backend import Backend, Source
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.testing import CharTokenizer, tiny_model
from rag_lookahead.testing.models import tiny_config

PROMPT = [3, 14, 15, 9, 26, 5, 3, 5]


def _engine(model: Any, **settings: Any) -> LookaheadEngine:
    return LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", **settings))


def _backend(**changes: Any) -> Backend:
    fields: dict[str, Any] = {
        "device": "cpu",
        "dtype": "float32",
        "attention": "rag_lookahead_sdpa",
        "linear": ((1, "torch"), (2, "reordered")),
        "forward": "direct",
        "batch_layout": "packed",
        "tree_problem": None,
        "sources": {"linear": Source.CACHED, "forward": Source.MEASURED},
    }
    return Backend(**{**fields, **changes})


def test_an_engine_says_what_its_forwards_run_on_and_where_each_choice_came_from() -> None:
    engine = _engine(tiny_model("llama"), cpu_linear="torch")
    backend = engine.backend
    assert backend is engine.runner.backend
    assert (backend.device, backend.dtype, backend.attention) == ("cpu", "float32", "rag_lookahead_sdpa")
    assert backend.linear == ((1, "torch"),) and backend.forward == "direct"
    assert backend.batch_layout == "packed" and backend.trees and backend.captured == ()
    assert dict(backend.sources) == {
        "device": Source.MODEL,
        "dtype": Source.MODEL,
        "attention": Source.MODEL,
        "linear": Source.NAMED,
        "forward": Source.MEASURED,
        "batch_layout": Source.MEASURED,
        "trees": Source.MEASURED,
        "step": Source.MODEL,
    }
    assert backend.step == "eager" and backend.step_problem is None
    assert str(backend) == (
        "cpu float32, attention rag_lookahead_sdpa (model); linear torch (named); forward direct "
        "(measured); batches packed (measured); trees verified (measured)"
    )
    data = json.loads(json.dumps(backend.as_dict()))
    assert data["linear"] == "torch" and data["linear_classes"] == [[1, "torch"]]
    assert data["sources"]["linear"] == "named" and data["trees"] is True and data["tree_problem"] is None


def test_a_forward_named_off_or_a_family_without_a_direct_one_runs_the_model() -> None:
    named = _engine(tiny_model("llama"), direct_forward=False).backend
    assert named.forward == "model" and named.sources["forward"] is Source.NAMED
    other = _engine(tiny_model("gpt2")).backend
    assert other.forward == "model" and other.sources["forward"] is Source.MODEL


def test_a_model_that_cannot_verify_trees_steps_padded_and_says_why() -> None:
    class MaskIgnoringLlama(LlamaForCausalLM):
        def forward(self, *args: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
            if attention_mask is not None and attention_mask.dim() == 4:
                attention_mask = None
            return super().forward(*args, attention_mask=attention_mask, **kwargs)

    backend = _engine(MaskIgnoringLlama(tiny_config("llama")).eval()).backend
    assert not backend.trees and backend.batch_layout == "padded"
    assert "4-D attention mask" in (backend.tree_problem or "")
    assert "trees not verified: a custom 4-D attention mask" in str(backend)


def test_a_change_of_the_models_structure_gives_a_new_backend_on_the_same_kernels() -> None:
    model = copy.deepcopy(tiny_model("gpt2"))  # dropout: in training mode it cannot verify
    engine = _engine(model, cpu_linear="torch")
    first = engine.backend
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.complete(PROMPT, max_new_tokens=2)
    trained = engine.backend
    assert trained is not first and not trained.trees and "training mode" in (trained.tree_problem or "")
    assert trained.linear == first.linear and trained.sources["linear"] is first.sources["linear"]
    model.eval()
    engine.complete(PROMPT, max_new_tokens=2)
    assert engine.backend.trees and engine.backend == first


def test_packed_the_old_spelling_of_reordered_weights_is_read_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match='"reordered"'):
        config = LookaheadConfig(cpu_linear="packed")  # type: ignore[arg-type]
    assert config.cpu_linear == "reordered"
    with pytest.raises(ValueError, match="'reordered'"):
        LookaheadConfig(cpu_linear="blas")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"linear": ((2, "torch"),)}, "ascend from one token"),
        ({"linear": ((1, "torch"), (1, "onednn"))}, "ascend from one token"),
        ({"linear": ((1, "packed"),)}, "kernels must be among"),
        ({"forward": "compiled"}, "forward must be"),
        ({"batch_layout": "ragged"}, "batches must be"),
        ({"tree_problem": "it cannot"}, "no batched steps to pack"),
        ({"sources": {"kernels": Source.NAMED}}, "sources name its choices"),
        ({"sources": {"linear": "cached"}}, "sources name its choices"),
    ],
)
def test_a_backend_that_says_something_impossible_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _backend(**changes)


def test_a_backend_is_immutable_and_prints_each_class_of_kernels() -> None:
    backend = _backend()
    with pytest.raises(AttributeError):
        backend.forward = "model"  # type: ignore[misc]
    with pytest.raises(TypeError):
        backend.sources["linear"] = Source.NAMED  # type: ignore[index]
    assert backend.linear_name == "torch,2:reordered"
    assert [backend.kernel(n) for n in (1, 2, 9)] == ["torch", "reordered", "reordered"]
    assert "linear torch,2:reordered (cached)" in str(backend) and "batches packed;" in str(backend)
    assert "captured 8x32,1x1" in str(replace(backend, captured=("8x32", "1x1")))


def test_the_runner_runs_only_a_backend_it_has_the_objects_for() -> None:
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="DirectForward"):
        ModelRunner(model, _backend(linear=((1, "torch"),)))
    with pytest.raises(ValueError, match="OneDnnLayers"):
        ModelRunner(model, _backend(forward="model"))
