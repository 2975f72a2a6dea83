"""Acceptance statistics carried across calls, engine variants and processes."""

from __future__ import annotations

import json

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.planning.acceptance import AcceptanceModel, load_acceptance, save_acceptance
from rag_lookahead.planning.planner import StepPlanner
from rag_lookahead.testing import CharTokenizer, tiny_model

HIT = DraftTree((0, 1, 2), (-1, 0, 1), ("none", "doc1", "doc1"), (1.0, 0.9, 0.4))


def learned(times: int = 30) -> AcceptanceModel:
    model = AcceptanceModel()
    for _ in range(times):
        model.update(HIT, [0, 1])  # the first node accepted, the second missed
    return model


def test_a_table_round_trips_through_its_file(tmp_path) -> None:
    model = learned()
    path = tmp_path / "acceptance.json"
    save_acceptance(path, {"model": "m"}, model)
    data = json.loads(path.read_text())
    assert data["format"] == "rag-lookahead-acceptance" and data["version"] == 1
    again = AcceptanceModel()
    assert load_acceptance(path, {"model": "m"}, again)
    assert again.state() == model.state()
    assert again.probability("doc1", True, 0.9) == model.probability("doc1", True, 0.9)
    # Another model's table, or another version, is no table: nothing is taken from it.
    other = AcceptanceModel()
    assert not load_acceptance(path, {"model": "other"}, other) and other.state()["buckets"] == []
    assert not load_acceptance(tmp_path / "missing.json", {"model": "m"}, other)


def test_a_planner_saves_what_it_learned_and_the_next_one_starts_from_it(tmp_path) -> None:
    path, key = tmp_path / "acceptance.json", {"model": "m"}
    first = StepPlanner(LookaheadConfig())
    first.load_acceptance(path, key)  # nothing stored yet
    for _ in range(30):
        first.learn(HIT, [0, 1])
    first.save_acceptance(every=100)  # too few nodes since the last write: not yet
    assert not path.exists()
    first.save_acceptance(every=10)
    second = StepPlanner(LookaheadConfig())
    second.load_acceptance(path, key)
    assert second.acceptance.state() == first.acceptance.state()
    # A variant learns into the same statistics.
    variant = first.with_config(LookaheadConfig(decoding_length=4))
    variant.learn(HIT, [0, 1])
    assert first.acceptance.observations == 62


def test_an_engine_probes_at_setup_and_keeps_its_statistics_under_its_cache_dir(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr("rag_lookahead.engine.lookahead._SAVE_EVERY", 1)  # write at every call's start
    import rag_lookahead.tuning.tuner as tuner_module

    probes = []
    probe = tuner_module.tree_support_problem
    monkeypatch.setattr(tuner_module, "tree_support_problem", lambda *a: probes.append(1) or probe(*a))
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(max_batch_size=2), cache_dir=tmp_path)
    assert probes == [1]  # built, it has probed the model, so that no answer pays for it
    engine.measure_costs()
    assert probes == [1]
    prompt = [3, 14, 15, 9, 26] * 4
    for _ in range(3):
        engine.complete(prompt, max_new_tokens=24)
    assert probes == [1]
    (stored,) = (tmp_path / "acceptance").glob("acceptance-*.json")
    fresh = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(max_batch_size=2), cache_dir=tmp_path)
    assert fresh.planner.acceptance.observations == 0
    fresh.measure_costs()
    assert fresh.planner.acceptance.state()["scales"]  # it starts from what the first one learned
    assert json.loads(stored.read_text())["key"] == {"model": stored.stem.removeprefix("acceptance-")}


def test_a_drafter_naming_a_new_source_every_step_leaves_a_table_that_loads_again() -> None:
    model = learned()
    for step in range(2_000):  # a caller's drafter that names a new source at every step
        tree = DraftTree(
            (0, 1, 2), (-1, 0, 1), ("none", f"s{step}", f"s{step}"), (1.0, 0.1 * (step % 10), 0.5)
        )
        model.update(tree, [0, 1, 2])
    again = AcceptanceModel()
    again.load_state(json.loads(json.dumps(model.state())))  # before, past 10,000 entries: refused
    assert again.state() == model.state()
    assert again.probability("doc1", True, 0.9) == model.probability("doc1", True, 0.9)
    # the sources learned first keep learning; the later ones lean on the priors alone
    assert again.scale("s1999", True) == AcceptanceModel().scale("s1999", True)
