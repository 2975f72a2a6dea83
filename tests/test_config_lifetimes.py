"""Each drafting setting's lifetime: an engine's variant applies a per-call change, refuses a
per-engine one naming it, and ignores none.

`CHANGES` is the table: every `LookaheadConfig` field, a valid value other than the engine's,
and what each way of deriving a variant (`LookaheadEngine.with_config`, `StepPlanner.with_config`,
a front end's `EngineSource`) does with it.
"""

from dataclasses import fields, replace
from typing import Any

import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.config import check_variant, lifetime_of, settings_of
from rag_lookahead.engine.request import Call, Decoder
from rag_lookahead.frontends import EngineSource
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_model

PROMPT = [3, 14, 15, 9, 26, 3, 14, 15]
N = 12
# The kernel named: no engine here times the kernels.
BASE = LookaheadConfig(mode="trie", min_query_length=1, cpu_linear="torch")

CHANGES: dict[str, tuple[Any, str]] = {
    "mode": ("jacobi", "applied"),
    "decoding_length": (4, "applied"),
    "min_query_length": (2, "applied"),
    "window_size": (2, "applied"),
    "ngram_size": (3, "applied"),
    "guess_set_size": (2, "applied"),
    "draft_policy": ("trie", "applied"),
    "branch_length": (13, "refused"),
    "max_query_length": (4, "refused"),
    "max_trie_nodes": (1000, "refused"),
    "max_batch_size": (2, "refused"),
    "max_tokens_per_forward": (128, "refused"),
    "max_prefill_tokens_per_step": (512, "refused"),
    "prefix_cache_mb": (0, "refused"),
    "cpu_linear": ("onednn", "refused"),
    "direct_forward": (False, "refused"),
    "step": ("static", "refused"),
    "max_model_len": (2048, "refused"),
}
APPLIED = sorted(name for name, (_, outcome) in CHANGES.items() if outcome == "applied")
REFUSED = sorted(name for name, (_, outcome) in CHANGES.items() if outcome == "refused")


@pytest.fixture(scope="module")
def engine() -> LookaheadEngine:
    return LookaheadEngine(tiny_model("llama"), CharTokenizer(), BASE)


def _changed(name: str) -> LookaheadConfig:
    return replace(BASE, **{name: CHANGES[name][0]})


def test_the_table_holds_every_setting_as_its_lifetime_says() -> None:
    assert set(CHANGES) == {f.name for f in fields(LookaheadConfig)}
    assert set(APPLIED) == set(settings_of("call"))
    assert set(REFUSED) == set(settings_of("engine"))
    assert all(lifetime_of(name) == "call" for name in APPLIED)
    assert all(lifetime_of(name) == "engine" for name in REFUSED)
    for name, (value, _) in CHANGES.items():
        assert getattr(BASE, name) != value, name
        assert getattr(_changed(name), name) == value  # valid beside the rest of BASE


@pytest.mark.parametrize("name", APPLIED)
def test_a_per_call_change_is_applied_to_the_variants_calls(
    engine: LookaheadEngine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    variant = engine.with_config(_changed(name))
    assert getattr(variant.config, name) == CHANGES[name][0] != getattr(engine.config, name)
    assert variant.planner.config is variant.config
    # One engine still: the same runner, trie, batches and costs.
    assert variant.runner is engine.runner and variant.trie is engine.trie
    assert variant.scheduler is engine.scheduler and variant.costs is engine.costs
    submitted: list[Decoder] = []
    submit = engine.scheduler.submit

    def recorded(call: Call, decoder: Decoder) -> None:
        submitted.append(decoder)
        submit(call, decoder)

    monkeypatch.setattr(engine.scheduler, "submit", recorded)
    completion = variant.complete(PROMPT, max_new_tokens=N)
    assert completion.token_ids == greedy_reference(engine.model, PROMPT, N)
    [decoder] = submitted
    assert decoder.config is variant.config and decoder.planner is variant.planner


@pytest.mark.parametrize("name", REFUSED)
def test_a_per_engine_change_is_refused_naming_it(engine: LookaheadEngine, name: str) -> None:
    changed = _changed(name)
    said = rf"{name} is set per engine \(.*engine's .*\): the engine's is {getattr(BASE, name)!r}"
    with pytest.raises(ValueError, match=said):
        engine.with_config(changed)
    with pytest.raises(ValueError, match=said):
        engine.planner.with_config(changed)
    with pytest.raises(ValueError, match=said):  # a front end's variant, refused as it is given
        EngineSource(engine=engine, lookahead_config=changed)
    with pytest.raises(ValueError, match=said):
        EngineSource(engine=engine, lookahead_config=changed, lookahead=False)


def test_a_config_of_defaults_names_every_per_engine_setting_it_would_change(engine: LookaheadEngine) -> None:
    """The usual slip: a fresh config for a variant carries defaults the engine was not built with."""
    small = LookaheadEngine(
        engine.model, engine.tokenizer, replace(BASE, max_batch_size=2, prefix_cache_mb=0)
    )
    with pytest.raises(
        ValueError, match="max_batch_size is set per engine.*prefix_cache_mb is set per engine"
    ) as err:
        small.with_config(LookaheadConfig(mode="trie", cpu_linear="torch"))
    assert "dataclasses.replace(engine.config" in str(err.value)
    plain = small.plain()  # derived from its own config: only the mode differs
    assert plain.config == replace(small.config, mode="off") and plain.scheduler is small.scheduler


def test_a_variant_is_a_config_and_the_names_are_fields() -> None:
    with pytest.raises(TypeError, match="must be a LookaheadConfig"):
        check_variant(BASE, {"mode": "off"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no LookaheadConfig setting is called 'threads'"):
        lifetime_of("threads")
    with pytest.raises(ValueError, match="lifetime must be 'call' or 'engine'"):
        settings_of("process")  # type: ignore[arg-type]
    assert check_variant(BASE, replace(BASE, mode="off", decoding_length=3)).decoding_length == 3


def test_a_given_tries_shape_is_the_engines_and_its_config_says_so() -> None:
    """A trie handed to the engine (e.g. read back with `TokenTrie.load`) drafts with its own
    shape: the engine's config reports that shape, not the config's that was not used, and a
    variant keeping it is accepted."""
    from rag_lookahead.drafting.trie import TokenTrie

    trie = TokenTrie(max_query_length=2, branch_length=5, max_nodes=5_000)
    engine = LookaheadEngine(
        tiny_model("llama"), CharTokenizer(), LookaheadConfig(min_query_length=1), trie=trie
    )
    shape = (engine.config.max_query_length, engine.config.branch_length, engine.config.max_trie_nodes)
    assert shape == (2, 5, 5_000)
    assert engine.trie is trie  # (empty, so falsy: still the one given, to share)
    assert engine.with_config(replace(engine.config, mode="trie")).trie is trie
    with pytest.raises(ValueError, match="min_query_length"):
        LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig(min_query_length=3), trie=trie)
