"""A model changed after its engine was built: every later call decodes the changed model.

Weights loaded, scaled in place, assigned through ``.data``, replaced or stepped by an
optimizer; hooks added; a layer wrapped (a LoRA-like adapter); PEFT adapters injected,
switched, disabled and merged; train() and back to eval(). Each answer is compared with
``generate`` on the model as it now is: the engine's prompt prefixes, reordered weights and
direct forward were all derived from the model as it was.
"""

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.runtime.fingerprint import ModelState
from rag_lookahead.testing import VOCAB, CharTokenizer, greedy_reference, tiny_model

PROMPT = [(7 * i + 3) % VOCAB for i in range(40)]
NEW_TOKENS = 12


def _model(family: str = "llama") -> Any:
    return copy.deepcopy(tiny_model(family))  # changed here: the shared one stays as it is


def _engine(model: Any, **settings: Any) -> LookaheadEngine:
    return LookaheadEngine(
        model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1, **settings)
    )


def _answer(engine: LookaheadEngine, prompt: list[int] = PROMPT) -> list[int]:
    return list(engine.complete(prompt, max_new_tokens=NEW_TOKENS).token_ids)


def _load_state_dict(model: Any) -> None:
    model.load_state_dict(tiny_model("llama", seed=1).state_dict())


def _scaled_in_place(model: Any) -> None:
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(-1.5)


def _data_assigned(model: Any) -> None:
    weight = model.model.layers[0].mlp.down_proj.weight
    weight.data = weight.data * -1.5


def _parameter_replaced(model: Any) -> None:
    layer = model.model.layers[0].self_attn.o_proj
    layer.weight = torch.nn.Parameter(layer.weight.detach() * -1.5)


def _optimizer_step(model: Any) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    model.train()
    ids = torch.tensor([PROMPT])
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    model.eval()


def _layer_hook(model: Any) -> None:
    model.model.layers[0].register_forward_hook(lambda _module, _inputs, out: out * -1.5)


def _embedding_hook(model: Any) -> None:
    model.model.embed_tokens.register_forward_hook(lambda _module, _inputs, out: out * -2.0)


def _pre_hook(model: Any) -> None:
    model.model.layers[0].self_attn.k_proj.register_forward_pre_hook(lambda _module, inputs: (-inputs[0],))


class _LowRank(torch.nn.Module):
    """A LoRA-like wrapper: the layer it replaces plus a low-rank product."""

    def __init__(self, base: torch.nn.Linear) -> None:
        super().__init__()
        self.base_layer = base
        self.down = torch.nn.Linear(base.in_features, 4, bias=False)
        self.up = torch.nn.Linear(4, base.out_features, bias=False)
        torch.nn.init.normal_(self.up.weight, std=2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.up(self.down(x))


def _wrapped_layer(model: Any) -> None:
    torch.manual_seed(3)
    attention = model.model.layers[0].self_attn
    attention.q_proj = _LowRank(attention.q_proj).eval()


def _instance_forward(model: Any) -> None:
    mlp = model.model.layers[0].mlp
    own = mlp.forward
    mlp.forward = lambda hidden: own(hidden) * -1.0


CHANGES: dict[str, Callable[[Any], None]] = {
    "load_state_dict": _load_state_dict,
    "mul_ under no_grad": _scaled_in_place,
    ".data assigned": _data_assigned,
    "Parameter replaced": _parameter_replaced,
    "optimizer step": _optimizer_step,
    "hook on a layer": _layer_hook,
    "hook on embed_tokens": _embedding_hook,
    "pre-hook on k_proj": _pre_hook,
    "LoRA-like wrapper in q_proj": _wrapped_layer,
    "forward replaced on the instance": _instance_forward,
}

SETTINGS = {
    "default": {},
    "cpu_linear=torch": {"cpu_linear": "torch"},
    "cpu_linear=reordered": {"cpu_linear": "reordered"},
    "direct_forward=False": {"direct_forward": False},
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=list(SETTINGS))
@pytest.mark.parametrize("change", CHANGES.values(), ids=list(CHANGES))
def test_a_change_after_the_first_call_is_decoded(
    change: Callable[[Any], None], settings: dict[str, Any]
) -> None:
    model = _model()
    engine = _engine(model, **settings)
    before = _answer(engine)
    assert before == greedy_reference(model, PROMPT, NEW_TOKENS)
    change(model)
    want = greedy_reference(model, PROMPT, NEW_TOKENS)
    assert want != before  # (the change matters to this prompt)
    assert _answer(engine) == want


def test_an_unchanged_model_keeps_its_prompts() -> None:
    engine = _engine(_model())
    _answer(engine)
    again = engine.complete(PROMPT, max_new_tokens=NEW_TOKENS)
    assert again.stats.cached_prompt_tokens == len(PROMPT) - 1


def test_a_hook_removed_again_restores_the_answer() -> None:
    model = _model()
    engine = _engine(model)
    before = _answer(engine)
    handle = model.model.layers[0].register_forward_hook(lambda _module, _inputs, out: out * -1.5)
    changed = _answer(engine)
    assert changed == greedy_reference(model, PROMPT, NEW_TOKENS) != before
    handle.remove()
    assert _answer(engine) == before
    assert engine.runner.direct is not None and engine.runner.direct.applies()


def test_a_second_engine_with_its_own_prefix_cache_sees_the_change() -> None:
    model = _model()
    engine = _engine(model)
    other = _engine(model, prefix_cache_mb=64)
    assert other.scheduler is not engine.scheduler
    _answer(engine)
    _answer(other)
    _scaled_in_place(model)
    want = greedy_reference(model, PROMPT, NEW_TOKENS)
    assert _answer(engine) == want
    assert _answer(other) == want


def test_a_prompt_prefilled_across_a_change_is_not_kept() -> None:
    """A call admitted before a change whose prompt was partly prefilled then (the caller's
    race) finishes it after: its entries mix both models, and no later call reuses them."""
    model = _model()
    engine = _engine(model)
    scheduler = engine.scheduler
    other = [(5 * i + 1) % VOCAB for i in range(9)]
    assert engine.tree_verification  # probed before the test steps the loop itself
    with engine.runner.thread.held():
        racing = engine.stream(PROMPT, max_new_tokens=4)
        scheduler._admit()
        (call,) = scheduler._joining
        scheduler._caches.cached_prefix(call)  # (its cache: nothing kept yet)
        _, cache, _ = scheduler._executor.prompt_apart(PROMPT[:20], scheduler._caches[call])
        scheduler._caches.put(call, cache)
        call.prefilled = 20  # its first chunk, before the change
        _scaled_in_place(model)
        later = engine.stream(other, max_new_tokens=4)  # sees the change: nothing kept is kept
        while not (racing.stats.new_tokens and later.stats.new_tokens):
            scheduler.iterate()
        racing.close()
        later.close()
    again = engine.complete(PROMPT, max_new_tokens=NEW_TOKENS)
    assert again.token_ids == greedy_reference(model, PROMPT, NEW_TOKENS)
    assert again.stats.cached_prompt_tokens == 0


def test_writes_torch_does_not_count_are_declared() -> None:
    """A write through ``.data`` bumps no version and keeps the storage: nothing tells the
    engine of it but `LookaheadEngine.model_changed`."""
    model = _model()
    engine = _engine(model, cpu_linear="reordered", prefix_cache_mb=0)
    before = _answer(engine)
    model.model.layers[0].mlp.up_proj.weight.data.mul_(-1.5)
    want = greedy_reference(model, PROMPT, NEW_TOKENS)
    assert want != before
    engine.model_changed()
    assert _answer(engine) == want


def test_prompt_logprobs_see_the_change() -> None:
    model = _model()
    engine = _engine(model, cpu_linear="reordered")
    engine.prompt_logprobs(PROMPT)
    _wrapped_layer(model)
    model.model.layers[0].self_attn.q_proj.base_layer.weight.data.mul_(-1.5)
    engine.model_changed()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].float()
    want = torch.log_softmax(logits, -1)[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
    got = torch.tensor([entry.logprob for entry in engine.prompt_logprobs(PROMPT).logprobs])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ train() and eval()


def test_training_mode_with_dropout_decodes_plainly_and_drafts_again_after_eval() -> None:
    model = _model("gpt2")  # dropout 0.1: its forwards differ in training mode
    engine = _engine(model)
    model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.complete(PROMPT, max_new_tokens=4)
    said = [str(w.message) for w in caught if "rag-lookahead" in str(w.message)]
    assert said and all("model.eval()" in text and "mask" not in text for text in said)
    assert not engine.tree_verification
    model.eval()
    completion = engine.complete(PROMPT, max_new_tokens=NEW_TOKENS)
    assert engine.tree_verification
    assert completion.token_ids == greedy_reference(model, PROMPT, NEW_TOKENS)
    assert sum(completion.stats.drafted_per_step) > 0


def test_a_model_built_in_training_mode_runs_directly_after_eval() -> None:
    model = _model().train()
    engine = _engine(model)
    assert engine.runner.direct is None
    model.eval()
    assert _answer(engine) == greedy_reference(model, PROMPT, NEW_TOKENS)
    assert engine.runner.direct is not None and engine.runner.direct.applies()


# ------------------------------------------------------------------ PEFT adapters


def _lora(rank: int = 4) -> Any:
    peft = pytest.importorskip("peft")
    return peft.LoraConfig(r=rank, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=list(SETTINGS))
def test_peft_adapters_injected_switched_disabled_and_merged(settings: dict[str, Any]) -> None:
    peft = pytest.importorskip("peft")
    model = _model()
    engine = _engine(model, **settings)  # over the base model, which PEFT changes in place
    answers = [_answer(engine)]

    def decoded() -> None:
        want = greedy_reference(model, PROMPT, NEW_TOKENS)
        assert want not in answers  # (each step changes this prompt's answer)
        assert _answer(engine) == want
        answers.append(want)

    torch.manual_seed(5)
    adapted = peft.get_peft_model(model, _lora(), adapter_name="first").eval()
    decoded()
    torch.manual_seed(6)
    adapted.add_adapter("second", _lora())
    adapted.set_adapter("second")
    adapted.eval()  # (its new layers are made in training mode)
    decoded()
    with adapted.disable_adapter():
        want = greedy_reference(model, PROMPT, NEW_TOKENS)
        assert want == answers[0]
        assert _answer(engine) == want
    adapted.set_adapter("first")
    assert _answer(engine) == answers[1]
    adapted.base_model.merge_adapter()  # writes the base weights through `.data`
    assert _answer(engine) == greedy_reference(model, PROMPT, NEW_TOKENS)
    adapted.base_model.unmerge_adapter()
    assert _answer(engine) == answers[1]


def test_an_engine_over_a_peft_model_follows_set_adapter() -> None:
    peft = pytest.importorskip("peft")
    torch.manual_seed(5)
    adapted = peft.get_peft_model(_model(), _lora(), adapter_name="first").eval()
    torch.manual_seed(6)
    adapted.add_adapter("second", _lora())
    engine = _engine(adapted.eval())
    first = _answer(engine)
    assert first == greedy_reference(adapted, PROMPT, NEW_TOKENS)
    adapted.set_adapter("second")
    want = greedy_reference(adapted, PROMPT, NEW_TOKENS)
    assert want != first
    assert _answer(engine) == want


# ------------------------------------------------------------------ the fingerprint


def test_the_fingerprint_sees_each_change_and_nothing_else() -> None:
    for name, change in CHANGES.items():
        model = _model()
        seen = ModelState.of(model)
        with torch.inference_mode():
            model(torch.tensor([PROMPT]))  # a forward changes nothing
        assert ModelState.of(model).change_from(seen) is None, name
        change(model)
        assert ModelState.of(model).change_from(seen) is not None, name
