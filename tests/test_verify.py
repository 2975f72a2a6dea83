import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from rag_lookahead.config import GenerationParams
from rag_lookahead.decoding.argmax import first_argmax
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.decoding.verify import (
    TokenChooser,
    accept,
    node_prefixes,
    position_uniform,
    sample_inverse_cdf,
)

TREE = DraftTree((10, 11, 12, 13, 14), (-1, 0, 1, 0, 3))  # 10 -> 11 -> 12 ; 10 -> 13 -> 14


def test_accept_follows_the_agreeing_branch_and_adds_a_bonus_token() -> None:
    # chosen token per node: root picks 13, node 3 (13) picks 14, node 4 (14) picks 7
    result = accept(TREE, [13, 99, 99, 14, 7])
    assert result.tokens == [13, 14, 7]
    assert result.nodes == [0, 3, 4]


def test_accept_with_no_match_is_one_plain_token() -> None:
    result = accept(TREE, [42, 0, 0, 0, 0])
    assert result.tokens == [42] and result.nodes == [0]


def test_node_prefixes_pad_with_the_root_token() -> None:
    rows = node_prefixes(torch.tensor([[1, 2, 10]]), TREE)
    assert rows.tolist() == [
        [1, 2, 10, 10, 10],
        [1, 2, 10, 11, 10],
        [1, 2, 10, 11, 12],
        [1, 2, 10, 13, 10],
        [1, 2, 10, 13, 14],
    ]


def test_repetition_penalty_uses_each_nodes_own_prefix() -> None:
    torch.manual_seed(0)
    logits = torch.randn(len(TREE), 20).abs() + 1.0
    chooser = TokenChooser(GenerationParams(repetition_penalty=1.5))
    context = [1, 2, 10]
    chosen = chooser.choose(logits, context, TREE)
    penalty = RepetitionPenaltyLogitsProcessor(1.5)
    for node in range(len(TREE)):
        prefix = context + [TREE.tokens[i] for i in TREE.path(node)[1:]]
        want = penalty(torch.tensor([prefix]), logits[node : node + 1].clone()).argmax().item()
        assert chosen[node] == want


def test_greedy_is_argmax_per_node() -> None:
    logits = torch.randn(len(TREE), 50)
    chooser = TokenChooser(GenerationParams())
    assert chooser.choose(logits, [1], TREE) == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible() -> None:
    logits = torch.randn(len(TREE), 50)
    params = GenerationParams(do_sample=True, seed=3, top_k=5)
    a = TokenChooser(params).choose(logits, [1], TREE)
    b = TokenChooser(params).choose(logits, [1], TREE)
    assert a == b
    top5 = logits.topk(5, dim=-1).indices
    assert all(tok in top5[i].tolist() for i, tok in enumerate(a))


def test_sibling_nodes_draw_with_the_same_keyed_number() -> None:
    # Nodes 1 and 3 both sit one past the root: given the same distribution, the same token.
    logits = torch.randn(1, 50).expand(len(TREE), -1)
    chosen = TokenChooser(GenerationParams(do_sample=True, seed=11)).choose(logits, [1], TREE)
    assert chosen[1] == chosen[3] and chosen[2] == chosen[4]


def test_keyed_numbers_depend_on_the_seed_and_position_only() -> None:
    values = {position_uniform(key, p) for key in range(20) for p in range(50)}
    assert len(values) == 1000 and all(0.0 <= u < 1.0 for u in values)
    assert position_uniform(7, 3) == position_uniform(7, 3)


def test_inverse_cdf_never_picks_a_zero_probability_token() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    for u in (0.0, 0.25, 0.5, 0.75, 1.0 - 2.0**-53):
        for row, token in enumerate(sample_inverse_cdf(probs, [u, u])):
            assert probs[row, token] > 0
    assert sample_inverse_cdf(probs, [0.49, 0.99]) == [1, 2]
    assert sample_inverse_cdf(probs, [0.51, 0.0]) == [3, 2]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 1 << 30),
    vocab=st.sampled_from([5, 2047, 2048, 2049, 5000, 49152, 50257]),
    rows=st.integers(1, 6),
    spread=st.sampled_from([2, 5, 1000]),
)
def test_first_argmax_is_torchs_argmax(seed: int, vocab: int, rows: int, spread: int) -> None:
    """Ties (few distinct values), NaN, -inf rows and a maximum in a short last block."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(-spread, spread, (rows, vocab), generator=generator).float()
    if seed % 3 == 0:
        scores[0, torch.randint(0, vocab, (2,), generator=generator)] = float("nan")
    if seed % 4 == 0:
        scores[-1] = float("-inf")
    if seed % 5 == 0:
        scores[rows // 2, -1] = float(spread)
    assert torch.equal(first_argmax(scores), scores.argmax(-1))
    assert torch.equal(first_argmax(scores[None]), scores[None].argmax(-1))  # leading dims kept
