"""oneDNN linear layers in the engine's CPU forwards: torch's values up to rounding, only there."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.runtime.kernels import linear_used, onednn_available, onednn_linear
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.testing import FAMILIES, CharTokenizer, tiny_model

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear")


def _inputs() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 24), torch.randn(48)
    wide = torch.randn(3, 17, 48)
    return [
        (torch.randn(1, 24), weight, None),  # one token
        (torch.randn(2, 5, 24), weight, bias),  # a batch of trees
        (wide[..., ::2], weight, None),  # not contiguous
        (torch.randn(1, 7, 24)[:, -1:], weight, bias),  # the last position's slice
    ]


@needs_onednn
@pytest.mark.parametrize("case", range(4))
def test_onednn_linear_gives_torchs_values(case: int) -> None:
    x, weight, bias = _inputs()[case]
    expected = torch.nn.functional.linear(x, weight, bias)
    with torch.inference_mode(), onednn_linear(True):
        got = torch.nn.functional.linear(x, weight, bias)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_only_fp32_cpu_calls_without_autograd_are_routed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __call__(self, *args: Any) -> Any:
            calls.append(args)
            return real(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", Spy())
    x, weight = torch.randn(2, 8), torch.randn(4, 8, requires_grad=True)
    with onednn_linear(True):
        torch.nn.functional.linear(x, weight).sum().backward()  # autograd: torch's own
        assert weight.grad is not None
        with torch.no_grad():
            torch.nn.functional.linear(x.double(), weight.double())  # another dtype
            torch.nn.functional.linear(x, weight)  # routed
            other = threading.Thread(target=_plain_linear, args=(x, weight))  # another thread: as is
            other.start()
            other.join()
    with torch.no_grad():
        torch.nn.functional.linear(x, weight)  # outside the block
    assert len(calls) == 1


def _plain_linear(x: torch.Tensor, weight: torch.Tensor) -> None:
    with torch.no_grad():
        torch.nn.functional.linear(x, weight)


def test_the_choice_applies_to_fp32_cpu_models_only() -> None:
    model = tiny_model("llama")
    cpu = torch.device("cpu")
    assert str(linear_used(model, cpu, "torch")) == "torch"
    assert str(linear_used(model, torch.device("cuda"), "onednn")) == "torch"
    assert str(linear_used(model, cpu, "onednn")) == ("onednn" if onednn_available() else "torch")


def test_a_variant_keeps_its_engines_kernel() -> None:
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="off"))
    assert engine.with_config(LookaheadConfig(mode="trie")).runner is engine.runner
    with pytest.raises(ValueError, match="cpu_linear is chosen once per engine"):
        engine.with_config(LookaheadConfig(cpu_linear="torch"))


@needs_onednn
@pytest.mark.parametrize("family", FAMILIES)
def test_a_runner_on_either_kernel_gives_the_same_logits(family: str) -> None:
    model = tiny_model(family)
    logits = [
        ModelRunner(model, kernel).forward(torch.tensor([[3, 14, 15, 9, 2, 6]]), new_tree_cache())[0]
        for kernel in ("onednn", "torch")
    ]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize(
    ("onednn_seconds", "chosen"),
    [
        ({1: 0.5, 4: 0.5, 16: 0.5, 256: 0.5}, "onednn"),
        ({1: 2.0, 4: 2.0, 16: 2.0, 256: 2.0}, "torch"),
        ({1: 2.0, 4: 0.5, 16: 0.5, 256: 2.0}, "torch,2:onednn,64:torch"),  # oneDNN for drafts, batches
        ({1: 0.5, 4: 2.0, 16: 0.5, 256: 0.5}, "onednn,2:torch,8:onednn"),
    ],
)
def test_auto_takes_the_kernel_that_multiplies_this_models_layers_faster_for_so_many_tokens(
    onednn_seconds: dict[int, float], chosen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag_lookahead.runtime import kernels

    def seconds(weights: Any, rows: int, onednn: bool) -> float:
        return onednn_seconds[rows] if onednn else 1.0

    monkeypatch.setattr(kernels, "_layers_seconds", seconds)
    model = tiny_model("llama")
    used = linear_used(model, torch.device("cpu"), "auto")
    assert str(used) == chosen and str(ModelRunner(model, "auto").linear) == chosen
    assert [used.onednn(n) for n in (1, 2, 3, 4, 15, 16, 63, 64, 300)] == [
        onednn_seconds[1] < 1,
        *[onednn_seconds[4] < 1] * 3,
        *[onednn_seconds[16] < 1] * 3,
        *[onednn_seconds[256] < 1] * 2,
    ]
    assert str(linear_used(model, torch.device("cuda"), "auto")) == "torch"  # nothing timed off a CPU


def test_auto_times_each_distinct_weight_once_for_every_layer_of_its_shape() -> None:
    from rag_lookahead.runtime.kernels import _distinct_weights

    model = tiny_model("llama")
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = _distinct_weights(model)
    assert sum(count for _, count in weights) == len(layers)
    assert len({tuple(w.shape) for w, _ in weights}) == len(weights) < len(layers)
    used = linear_used(model, torch.device("cpu"), "auto")
    assert used.classes[0][0] == 1 and all(kernel in ("onednn", "torch") for _, kernel in used.classes)


def test_a_prompts_chunk_is_timed_without_the_output_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's logits are read at its last token alone: its class is timed without the head."""
    from rag_lookahead.runtime import kernels

    model = tiny_model("llama")
    head = model.get_output_embeddings().weight
    seen: dict[int, bool] = {}

    def seconds(weights: Any, rows: int, onednn: bool) -> float:
        seen[rows] = any(w is head for w, _ in weights)
        return 1.0

    monkeypatch.setattr(kernels, "_layers_seconds", seconds)
    kernels.faster_linear(model)
    assert seen == {1: True, 4: True, 16: True, 256: False}
