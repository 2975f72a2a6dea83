"""oneDNN linear layers in the engine's CPU forwards (over the weights as they are, or reordered
once into its layout): torch's values up to rounding, only there; ``cpu_linear="auto"``'s choice
(`rag_lookahead.tuning.kernel_choice`), timed by runners of its own and kept on disk."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.runtime.backend import Source
from rag_lookahead.runtime.kernels import LinearKernels, OneDnnLayers, onednn_available
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.testing import FAMILIES, CharTokenizer, tiny_model
from rag_lookahead.tuning import ModelTuning, kernel_cache, kernel_choice
from rag_lookahead.tuning.kernel_choice import chosen_linear


def linear_used(model: Any, device: torch.device, choice: Any, cache_dir: Any = None) -> LinearKernels:
    """The kernels chosen (where the choice came from left out)."""
    return chosen_linear(model, device, choice, cache_dir=cache_dir)[0]


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


def _layer(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


@needs_onednn
@pytest.mark.parametrize("reordered", [False, True])
@pytest.mark.parametrize("case", range(4))
def test_onednn_layers_give_torchs_values(case: int, reordered: bool) -> None:
    x, weight, bias = _inputs()[case]
    layer = _layer(weight, bias)
    expected = torch.nn.functional.linear(x, weight, bias)
    layers = OneDnnLayers(layer)
    if reordered:
        layers.reorder()
    with torch.inference_mode(), layers.installed(reordered):
        got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_reordered_weight_changed_in_place_or_replaced_is_reordered_again() -> None:
    torch.manual_seed(1)
    layer = torch.nn.Linear(24, 48)
    layers = OneDnnLayers(layer)
    layers.reorder()
    x = torch.randn(3, 24)
    first = layers.reordered(layer.weight)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # e.g. `load_state_dict` into the same parameters
    assert layers.reordered(layer.weight) is not first
    for weight in (layer.weight, torch.nn.Parameter(torch.randn(48, 24))):
        layer.weight = weight
        with torch.inference_mode(), layers.installed(reordered=True):
            got = layer(x)
        expected = torch.nn.functional.linear(x, weight.detach(), layer.bias.detach())
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_only_fp32_cpu_calls_without_autograd_are_routed_and_only_within_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __call__(self, *args: Any) -> Any:
            calls.append(args)
            return real(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", Spy())
    layer, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
    layers = OneDnnLayers(layer)
    with layers.installed():
        layer(x).sum().backward()  # autograd: torch's own
        assert layer.weight.grad is not None
        with torch.no_grad():
            layer.double()(x.double())  # another dtype
            layer.float()(x)  # routed
    with torch.no_grad():
        layer(x)  # outside the block
    assert len(calls) == 1 and "forward" not in layer.__dict__


@needs_onednn
def test_a_layer_with_its_own_forward_is_left_as_it_is() -> None:
    """accelerate's hooks, for one, shadow a layer's forward on the instance: kept."""
    layer = torch.nn.Linear(8, 4)
    hook = layer.forward
    layer.forward = lambda x: hook(x) + 1  # type: ignore[method-assign,assignment]
    own = layer.forward
    with torch.no_grad(), OneDnnLayers(layer).installed():
        assert layer.forward is own
        out = layer(torch.zeros(1, 8))
    assert layer.forward is own
    torch.testing.assert_close(out, layer.bias.detach()[None] + 1)


def test_the_choice_applies_to_fp32_cpu_models_only() -> None:
    model = tiny_model("llama")
    cpu = torch.device("cpu")
    assert chosen_linear(model, cpu, "torch")[1] is Source.NAMED
    kernels, source = chosen_linear(model, torch.device("cuda"), "onednn")
    assert str(kernels) == "torch" and source is Source.MODEL  # nothing to choose there
    assert str(linear_used(model, cpu, "onednn")) == ("onednn" if onednn_available() else "torch")
    assert str(linear_used(model, cpu, "reordered")) == ("reordered" if onednn_available() else "torch")


@needs_onednn
def test_engines_over_one_model_share_its_kernels_and_one_reordered_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed: list[int] = []

    def seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        timed.append(rows)
        return {"torch": 1.0, "onednn": 0.5, "reordered": 0.25}[kernel]

    monkeypatch.setattr(kernel_choice, "_layers_seconds", seconds)
    model, cpu = copy.deepcopy(tiny_model("llama")), torch.device("cpu")
    onednn = linear_used(model, cpu, "onednn")
    assert onednn.layers is not None and not onednn.layers.keeps_copies  # no copy for oneDNN alone
    first, again = linear_used(model, cpu, "auto"), linear_used(model, cpu, "auto")
    assert again is first and len(timed) == 3 * len(kernel_choice._CLASSES) * 3  # timed once
    assert first.layers is onednn.layers is linear_used(model, cpu, "reordered").layers
    assert str(first) == "reordered" and first.layers.keeps_copies
    other = linear_used(copy.deepcopy(model), cpu, "auto")
    assert other.layers is not first.layers  # another model: its own


def test_a_variant_keeps_its_engines_kernel() -> None:
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(mode="off"))
    assert engine.with_config(LookaheadConfig(mode="trie")).runner is engine.runner
    with pytest.raises(ValueError, match="cpu_linear is set per engine"):
        engine.with_config(LookaheadConfig(cpu_linear="torch"))


@needs_onednn
@pytest.mark.parametrize("family", FAMILIES)
def test_a_runner_on_either_kernel_gives_the_same_logits(family: str) -> None:
    model = tiny_model(family)
    logits = [
        ModelTuning(model, kernel).runner.forward(torch.tensor([[3, 14, 15, 9, 2, 6]]), new_tree_cache())[0]
        for kernel in ("onednn", "reordered", "torch")
    ]
    torch.testing.assert_close(logits[0], logits[2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], logits[2], rtol=1e-5, atol=1e-5)


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
    def seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        return {"torch": 1.0, "onednn": onednn_seconds[rows], "reordered": 3.0}[kernel]

    monkeypatch.setattr(kernel_choice, "_layers_seconds", seconds)
    model = copy.deepcopy(tiny_model("llama"))  # its own: the kernels are chosen once per model
    # Chosen in the thread a runner chooses in: a thread count is per thread, and another
    # count is another choice (which a runner would time by its own forwards).
    used = ModelThread.shared().call(lambda: linear_used(model, torch.device("cpu"), "auto"))
    assert str(used) == chosen and ModelTuning(model, "auto").backend.linear_name == chosen
    assert used.layers is None or not used.layers.keeps_copies  # not chosen: no copy kept
    assert [used.kernel(n) == "onednn" for n in (1, 2, 3, 4, 15, 16, 63, 64, 300)] == [
        onednn_seconds[1] < 1,
        *[onednn_seconds[4] < 1] * 3,
        *[onednn_seconds[16] < 1] * 3,
        *[onednn_seconds[256] < 1] * 2,
    ]
    assert str(linear_used(model, torch.device("cuda"), "auto")) == "torch"  # nothing timed off a CPU


@needs_onednn
@pytest.mark.parametrize("fits", [True, False])
def test_auto_takes_reordered_weights_where_fastest_and_only_where_their_copy_fits(
    fits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    def seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        return {"torch": 1.0, "onednn": 0.5, "reordered": 0.25 if rows < 256 else 2.0}[kernel]

    monkeypatch.setattr(kernel_choice, "_layers_seconds", seconds)
    monkeypatch.setattr(kernel_choice, "_REORDERED_SHARE", 0.25 if fits else 0.0)
    model = copy.deepcopy(tiny_model("llama"))  # its own: the kernels are chosen once per model
    used = linear_used(model, torch.device("cpu"), "auto")
    assert str(used) == ("reordered,64:onednn" if fits else "onednn")
    assert used.layers is not None and used.layers.keeps_copies == fits
    assert (used.layers.nbytes > 0) == fits


@needs_onednn
def test_auto_takes_each_kernels_least_time_so_a_burst_of_other_work_decides_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timed in turn, two of the fastest kernel's three repeats met other work: its median is
    the slowest, its least time still the fastest."""
    calls: dict[str, int] = {}

    def seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        calls[kernel] = calls.get(kernel, 0) + 1
        burst = kernel == "reordered" and calls[kernel] % 3 != 1  # all but its first of three
        return {"torch": 1.0, "onednn": 0.9, "reordered": 0.5}[kernel] * (3.0 if burst else 1.0)

    monkeypatch.setattr(kernel_choice, "_layers_seconds", seconds)
    model = copy.deepcopy(tiny_model("llama"))
    assert str(kernel_choice.faster_linear(model, reorder=True)) == "reordered"


@needs_onednn
def test_auto_times_every_class_by_the_runners_own_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine choosing its kernels times a step's classes (1, 4 and 16 tokens) and a prompt's
    chunk (256 tokens) by its forwards on each kernel in turn, not the layers alone, each kernel
    on a runner of its own (the engine's is never made to run on another meanwhile); it forwards
    on what it chose, the direct forward probed on it."""
    layered: list[int] = []
    forwarded: list[tuple[str, str, int]] = []
    runners: set[ModelRunner] = set()
    fake = {"torch": 2.0, "onednn": 1.0, "reordered": 0.5}

    def layers_seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        layered.append(rows)
        return 1.0

    def faked(name: str, real: Any, prices: dict[str, float]) -> Any:
        def timer(prefill: ModelRunner, context: int) -> Any:
            timed = real(prefill, context)

            def seconds(runner: ModelRunner, tokens: int) -> float:
                kernel = runner.linear.kernel(tokens)
                forwarded.append((name, kernel, tokens))
                runners.add(runner)
                timed(runner, tokens)  # the forward runs; its time is made up
                return prices[kernel]

            return seconds

        return timer

    monkeypatch.setattr(kernel_choice, "_layers_seconds", layers_seconds)
    monkeypatch.setattr(kernel_choice, "chain_timer", faked("step", kernel_choice.chain_timer, fake))
    chunk_prices = {"torch": 2.0, "onednn": 0.5, "reordered": 1.0}
    monkeypatch.setattr(kernel_choice, "chunk_timer", faked("chunk", kernel_choice.chunk_timer, chunk_prices))
    tuning = ModelTuning(copy.deepcopy(tiny_model("llama")), "auto")
    assert layered == []
    kinds = sorted(set(forwarded))
    assert kinds == sorted(
        [("step", k, n) for k in fake for n in (1, 4, 16)] + [("chunk", k, 256) for k in fake]
    )
    assert len(forwarded) == 3 * 4 * 3
    assert len(runners) == 3 and tuning.runner not in runners  # one per kernel, none the engine's
    assert tuning.backend.linear_name == "reordered,64:onednn" and tuning.backend.forward == "direct"
    assert tuning.backend.sources["linear"] is Source.MEASURED


@needs_onednn
def test_a_class_past_the_models_window_is_timed_on_the_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of 200 positions: a 256-token chunk cannot be forwarded after the prompt, so
    that class is timed on the layers alone; a step's classes still by forwards."""
    from transformers import AutoModelForCausalLM

    from rag_lookahead.testing.models import tiny_config

    layered: list[int] = []

    def layers_seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        layered.append(rows)
        return {"torch": 1.0, "onednn": 0.5, "reordered": 2.0}[kernel]

    monkeypatch.setattr(kernel_choice, "_layers_seconds", layers_seconds)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", max_position_embeddings=200)).eval()
    runner = ModelTuning(model, "auto").runner
    assert set(layered) == {256} and runner.linear.kernel(300) == "onednn"


class _Timed:
    """Fake layer timings (oneDNN's the fastest, then reordered, then torch), counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, weights: Any, rows: int, kernel: str, layers: Any) -> float:
        self.calls += 1
        return {"torch": 1.0, "onednn": 0.5, "reordered": 0.75}[kernel]


def _busy(busy: bool) -> Any:
    from contextlib import contextmanager

    from rag_lookahead.planning.load import MachineLoad

    @contextmanager
    def watch() -> Any:
        yield [MachineLoad(1.0, 1.0, 3.0 if busy else 1.0, 2)]

    return watch


@needs_onednn
def test_autos_choice_is_kept_for_the_next_process_and_a_busy_ones_for_an_hour(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner over another copy of the model (what a new process loads) reads the choice
    back instead of timing; one made while other work shared the cores is kept for an hour."""
    timed = _Timed()
    monkeypatch.setattr(kernel_choice, "_layers_seconds", timed)
    monkeypatch.setattr(kernel_choice, "watch_load", _busy(True))
    model, cpu = tiny_model("llama"), torch.device("cpu")
    first, source = chosen_linear(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)
    assert str(first) == "onednn" and timed.calls > 0 and source is Source.MEASURED
    (stored,) = (tmp_path / "kernels").glob("kernels-v1-*.json")
    assert '"loaded": true' in stored.read_text()
    timed.calls = 0
    again, source = chosen_linear(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)
    assert str(again) == "onednn" and again.layers is not None and timed.calls == 0  # read back
    assert source is Source.CACHED
    later = kernel_cache.time.time() + kernel_cache.LOADED_MAX_AGE_SECONDS + 1
    monkeypatch.setattr(kernel_cache.time, "time", lambda: later)
    monkeypatch.setattr(kernel_choice, "watch_load", _busy(False))
    linear_used(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)
    assert timed.calls > 0 and '"loaded": false' in stored.read_text()  # chosen again, quietly


@needs_onednn
def test_a_choice_whose_timings_did_not_settle_is_kept_for_an_hour_only(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine that looked quiet, the chosen kernel's least time seen once only (its other
    timings 80% longer): a burst may have decided it."""
    calls: list[str] = []

    def seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        calls.append(kernel)
        once = kernel == "onednn" and calls.count(kernel) % 3 == 1
        return {"torch": 1.0, "onednn": 0.5 if once else 0.9, "reordered": 0.95}[kernel]

    monkeypatch.setattr(kernel_choice, "_layers_seconds", seconds)
    monkeypatch.setattr(kernel_choice, "watch_load", _busy(False))
    assert (
        str(linear_used(copy.deepcopy(tiny_model("llama")), torch.device("cpu"), "auto", cache_dir=tmp_path))
        == "onednn"
    )
    (stored,) = (tmp_path / "kernels").glob("kernels-v1-*.json")
    assert '"loaded": true' in stored.read_text()


@needs_onednn
@pytest.mark.parametrize(
    "classes",
    [
        '[[1, "rm -rf"]]',  # no such kernel
        '[[1, "torch"], [1, "onednn"]]',  # a class twice
        '[[2, "torch"]]',  # no class from one token
        '[[1, "torch"], [64, "onednn"], [8, "torch"]]',  # not ascending
        '"torch"',  # not a list of classes
        "[]",
        '[[1, "reordered"]]',  # reordered where its copy was found not to fit
        '[[1, "packed"]]',  # (its earlier name) likewise
    ],
)
def test_a_kernel_choice_file_that_is_not_well_formed_is_chosen_again(
    classes: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed = _Timed()
    monkeypatch.setattr(kernel_choice, "_layers_seconds", timed)
    monkeypatch.setattr(kernel_choice, "_REORDERED_SHARE", 0.0)  # the copy does not fit: never
    model, cpu = tiny_model("llama"), torch.device("cpu")
    linear_used(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)
    (stored,) = (tmp_path / "kernels").glob("kernels-v1-*.json")
    text = stored.read_text()
    stored.write_text(text[: text.rindex('"classes"')] + f'"classes": {classes}\n}}')
    timed.calls = 0
    assert str(linear_used(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)) == "onednn"
    assert timed.calls > 0


@needs_onednn
def test_a_kernel_choice_file_naming_the_reordered_kernel_packed_is_read_back(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files written before the reordered kernel had its name call it ``packed``."""
    timed = _Timed()
    monkeypatch.setattr(kernel_choice, "_layers_seconds", timed)
    monkeypatch.setattr(kernel_choice, "_REORDERED_SHARE", 1.0)  # the copy fits
    model, cpu = tiny_model("llama"), torch.device("cpu")
    chosen_linear(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)
    (stored,) = (tmp_path / "kernels").glob("kernels-v1-*.json")
    text = stored.read_text()
    stored.write_text(text[: text.rindex('"classes"')] + '"classes": [[1, "packed"], [64, "onednn"]]\n}')
    timed.calls = 0
    kernels, source = chosen_linear(copy.deepcopy(model), cpu, "auto", cache_dir=tmp_path)
    assert str(kernels) == "reordered,64:onednn" and source is Source.CACHED and timed.calls == 0
    assert kernels.layers is not None and kernels.layers.keeps_copies


def test_auto_times_each_distinct_weight_once_for_every_layer_of_its_shape() -> None:
    from rag_lookahead.runtime.kernels import linear_weights

    model = tiny_model("llama")
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = linear_weights(model)
    assert sum(count for _, count in weights) == len(layers)
    assert len({tuple(w.shape) for w, _ in weights}) == len(weights) < len(layers)
    used = linear_used(model, torch.device("cpu"), "auto")
    assert used.classes[0][0] == 1 and all(
        kernel in ("onednn", "reordered", "torch") for _, kernel in used.classes
    )


def test_a_prompts_chunk_is_timed_without_the_output_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's logits are read at its last token alone: its class is timed without the head."""
    model = tiny_model("llama")
    head = model.get_output_embeddings().weight
    seen: dict[int, bool] = {}

    def seconds(weights: Any, rows: int, kernel: str, layers: Any) -> float:
        seen[rows] = any(w is head for w, _ in weights)
        return 1.0

    monkeypatch.setattr(kernel_choice, "_layers_seconds", seconds)
    kernel_choice.faster_linear(model)
    assert seen == {1: True, 4: True, 16: True, 256: False}


def test_a_cpu_runner_tells_the_allocator_once_that_large_blocks_are_common() -> None:
    from rag_lookahead.runtime import memory

    ModelTuning(tiny_model("llama"), "torch")
    ModelTuning(tiny_model("gpt2"), "torch")
    assert memory.large_blocks_expected.cache_info().currsize == 1  # once per process
