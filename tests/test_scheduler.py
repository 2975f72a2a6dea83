"""The scheduler's step as data, without a model: a plan from calls in known states, and the
update from a made-up executor output (`StepOutput`), over a batch cache that only records
what it is asked to keep."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rag_lookahead import GenerationParams, LookaheadConfig
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.decoding.verify import TokenChooser
from rag_lookahead.engine.request import END, Call, CallStatus, Decoder
from rag_lookahead.engine.scheduler import Scheduler
from rag_lookahead.engine.step import RowPlan, StepOutput, StepPlan
from rag_lookahead.planning.costs import CostCurve, CostModel
from rag_lookahead.planning.planner import StepPlanner
from rag_lookahead.runtime.batch import filled_holes
from rag_lookahead.streaming.stats import StepRecorder
from rag_lookahead.streaming.stopping import Stopping
from rag_lookahead.testing import CharTokenizer

V = 16  # vocabulary of the made-up logits
CONFIG = LookaheadConfig(mode="trie", max_batch_size=4)


class ChainDrafter:
    """Proposes ``chain`` below the context's last token, every step."""

    def __init__(self, *chain: int, fails: bool = False) -> None:
        self.chain, self.fails, self.closed = chain, fails, False

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        if self.fails:
            raise LookupError("the drafter broke")
        tokens = (context[-1], *self.chain[:budget])
        return StepDraft(DraftTree(tokens, tuple(range(-1, len(tokens) - 1))))

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class RecordingBatch:
    """The `BatchCache` calls the scheduler makes in a step, recorded; rows leave as there."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.kept: list[tuple[int, list[list[int]]]] = []

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def keep_accepted(self, width: int, nodes: Sequence[Sequence[int]]) -> None:
        self.kept.append((width, [list(n) for n in nodes]))

    def keep_rows(self, keep: Sequence[int]) -> list[int]:
        order = filled_holes(keep)
        self.lengths = [self.lengths[i] for i in order]
        return order

    def row_view(self, index: int) -> None:
        return None

    def add_row(self, cache: Any, expected_rows: int = 0) -> int:
        self.lengths.append(0)
        return len(self.lengths) - 1


class EagerExecutor:
    """An executor whose runner runs no static step (the batch grows its caches)."""

    runner = SimpleNamespace(static=None)


class ScriptedExecutor(EagerExecutor):
    """Returns, per row, logits whose argmax is the scripted tokens; records the plans."""

    def __init__(self, *rows: list[int]) -> None:
        self.rows = rows
        self.plans: list[StepPlan] = []

    def run(self, plan: StepPlan, batch: Any) -> StepOutput:
        self.plans.append(plan)
        return StepOutput(tuple(_logits(tokens) for tokens in self.rows), 0.001)


class ApartExecutor(EagerExecutor):
    """Prefills prompts' chunks apart, recording each chunk's size and whose it was."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, int]] = []  # (the prompt's first token, the chunk's tokens)

    def prompt_apart(self, tokens: list[int], cache: Any) -> tuple[torch.Tensor, Any, float]:
        self.chunks.append((tokens[0] // 1000, len(tokens)))
        return _logits([3]), cache, 0.001


def _logits(tokens: list[int]) -> torch.Tensor:
    logits = torch.full((len(tokens), V), -10.0)  # [n, V]
    logits[range(len(tokens)), tokens] = 10.0
    return logits


# Every test call's decoder, as a scheduler holds them beside its calls (`scheduler_with`).
DECODERS: dict[Call, Decoder] = {}


def new_call(prompt: list[int], *, drafter: Any = None, prefilled: int | None = None) -> Call:
    stopping = Stopping(
        CharTokenizer(),
        eos=(15,),
        stop_strings=(),
        max_new_tokens=8,
        prompt_length=len(prompt),
        context_window=None,
    )
    call = Call(prompt_ids=prompt, recorder=StepRecorder(prompt_tokens=len(prompt)))
    call.prefilled = len(prompt) if prefilled is None else prefilled
    call.status = CallStatus.DECODING if call.prefilled == len(prompt) else CallStatus.PREFILLING
    chooser = TokenChooser(GenerationParams())
    DECODERS[call] = Decoder(CONFIG, StepPlanner(CONFIG), chooser, stopping, drafter=drafter)
    return call


def scheduler_with(rows: list[Call], executor: Any = None, prefill_budget: int = 2048) -> Scheduler:
    # No model thread runs its loop: each test runs the phases itself.
    idle = SimpleNamespace(attach=lambda _: None, wake=lambda: None, in_thread=lambda: True)
    tuning = SimpleNamespace(
        runner=SimpleNamespace(packs=lambda: False, static=None), thread=idle, generation=0
    )
    scheduler = Scheduler(
        tuning,  # type: ignore[arg-type]
        CostModel(),
        max_batch_size=4,
        max_tokens_per_forward=256,
        max_prefill_tokens_per_step=prefill_budget,
    )
    scheduler._decoders = DECODERS
    scheduler._rows.calls = list(rows)
    scheduler._rows.cache = RecordingBatch([call.prefilled for call in rows])  # type: ignore[assignment]
    if executor is not None:
        scheduler._executor = scheduler._rows.executor = scheduler._caches.executor = executor
    return scheduler


def step(scheduler: Scheduler) -> None:
    """One step of the batch, as the loop runs it."""
    scheduler._rows.step(scheduler, scheduler._decoders, scheduler._end, scheduler._kept.keep)


def released(call: Call) -> list[Any]:
    items = []
    while not call.outbox.empty():
        item = call.outbox.get()
        items.append(item if item is END or isinstance(item, BaseException) else item.token_ids)
    return items


def test_a_plan_puts_each_rows_draft_or_prompt_chunk_in_row_order() -> None:
    drafting = new_call([1, 2], drafter=ChainDrafter(3, 4))
    plain = new_call([5])
    joining = new_call(list(range(10)), prefilled=4)
    scheduler = scheduler_with([drafting, plain, joining])
    plan = scheduler._rows.plan(
        [drafting, plain, joining],
        DECODERS,
        {drafting: DECODERS[drafting].drafter.propose([1, 2], 8), plain: StepDraft(DraftTree.root_only(5))},  # type: ignore[union-attr]
    )
    assert [row.prompt for row in plan.rows] == [False, False, True]
    assert [row.draft.tree.tokens for row in plan.rows] == [(2, 3, 4), (5,), (4, 5, 6, 7, 8, 9)]
    # Costs not measured: the prompt's chunk is what is left, up to an equal share of the forward.
    assert plan.rows[2].ends_prompt and plan.width == 6
    assert plan.logit_positions() == [0, 1, 2, 5]  # the drafts' nodes and the prompt's last token


def test_a_lone_prompt_is_planned_whole_and_a_partial_chunk_reads_no_logits() -> None:
    joining = new_call(list(range(300)), prefilled=10)
    plan = scheduler_with([joining])._rows.plan([joining], DECODERS, {})
    assert len(plan.rows[0].draft) == 290 and plan.rows[0].ends_prompt
    partial = StepPlan(
        (RowPlan(StepDraft(DraftTree.root_only(1))), RowPlan.prompt_chunk(list(range(9)), 0, 4))
    )
    assert not partial.rows[1].ends_prompt and partial.logit_positions() == [0]


def test_an_update_keeps_accepted_paths_releases_tokens_and_ends_a_failed_row_alone() -> None:
    drafting = new_call([1, 2], drafter=ChainDrafter(3, 4))
    failing = new_call([5])
    DECODERS[failing].chooser = SimpleNamespace(choose=_raise(ValueError("choice failed")))  # type: ignore[assignment]
    joining = new_call([7, 8, 9], prefilled=1)
    # The model agrees with 3 and then says 6 (not 4); the joining prompt's last token gives 11.
    executor = ScriptedExecutor([3, 6, 0], [0], [11])
    scheduler = scheduler_with([drafting, failing, joining], executor)
    step(scheduler)
    batch = scheduler._rows.cache
    assert batch.kept == [(3, [[0, 1], [0], [0, 1]])]  # type: ignore[attr-defined]
    assert released(drafting) == [[3, 6]]
    (error,) = released(failing)
    assert isinstance(error, ValueError) and failing.status is CallStatus.FINISHED_ABANDONED
    assert released(joining) == [[11]] and joining.status is CallStatus.DECODING
    assert scheduler._rows.calls == [drafting, joining] and batch.lengths == [2, 1]


def test_a_row_whose_drafter_fails_leaves_before_the_forward_and_the_plan_follows_the_new_row_order() -> None:
    """The rows after a leaving one move into its place (`BatchCache.keep_rows`): the plan must
    list the calls in the cache's new order, or each row would be verified against another's."""
    broken = ChainDrafter(fails=True)
    first = new_call([1], drafter=broken)
    second, third = new_call([2], drafter=ChainDrafter(9)), new_call([3], drafter=ChainDrafter(8))
    executor = ScriptedExecutor([8, 1], [9, 1])
    scheduler = scheduler_with([first, second, third], executor)
    step(scheduler)
    assert isinstance(released(first)[0], LookupError) and broken.closed
    assert scheduler._rows.calls == [third, second]
    (plan,) = executor.plans
    assert [row.draft.tree.tokens for row in plan.rows] == [(3, 8), (2, 9)]
    assert released(third) == [[8, 1]] and released(second) == [[9, 1]]


def test_a_call_that_stops_ends_with_its_finish_reason_and_leaves() -> None:
    stopping = new_call([1], drafter=ChainDrafter(15))  # 15 is the end of sequence
    staying = new_call([2])
    scheduler = scheduler_with([stopping, staying], ScriptedExecutor([15, 0], [4]))
    step(scheduler)
    assert released(stopping) == [[15], END] and stopping.status is CallStatus.FINISHED_EOS
    assert stopping.recorder.finish_reason == "eos" and stopping.ended.is_set()
    assert scheduler._rows.calls == [staying] and staying.status is CallStatus.DECODING


@pytest.mark.parametrize("reason", ["eos", "stop_string", "length", "context_window", "abandoned"])
def test_a_finished_status_names_its_reason_and_the_first_reason_stands(reason: Any) -> None:
    call = new_call([1])
    call.finish(reason)
    call.finish("abandoned")
    assert call.status.is_finished() and call.status.finish_reason == reason
    assert call.recorder.finish_reason == reason
    assert not CallStatus.DECODING.is_finished() and CallStatus.PREFILLING.finish_reason is None


def test_a_waiting_call_cancelled_ends_at_once_holding_nothing() -> None:
    scheduler = scheduler_with([])
    call = new_call([1])
    call.status = CallStatus.WAITING
    scheduler.submit(call, DECODERS[call])
    scheduler.cancel(call, wait=False)
    assert call.status is CallStatus.FINISHED_ABANDONED and released(call) == [END] and call.ended.is_set()


def _raise(error: Exception) -> Any:
    def raising(*args: Any, **kwargs: Any) -> Any:
        raise error

    return raising


def submit(scheduler: Scheduler, call: Call) -> None:
    scheduler.submit(call, DECODERS[call])


def prompt(k: int, tokens: int) -> Call:
    """A joining call whose prompt's tokens are ``k`` thousand and up."""
    return new_call(list(range(k * 1000, k * 1000 + tokens)), prefilled=0)


@pytest.mark.parametrize(
    ("budget", "chunks", "started"),
    [
        (1, [(1, 256)], [False, False, False]),  # one chunk a step, at least
        (512, [(1, 256), (1, 44), (2, 256)], [True, False, False]),  # begun while under it
        (2048, [(1, 256), (1, 44), (2, 256), (2, 44), (3, 256), (3, 44)], [True, True, True]),
    ],
)
def test_joining_prompts_of_equal_length_are_prefilled_apart_in_arrival_order_up_to_the_budget(
    budget: int, chunks: list[tuple[int, int]], started: list[bool]
) -> None:
    running = new_call([1, 2], drafter=ChainDrafter())
    executor = ApartExecutor()
    scheduler = scheduler_with([running], executor, prefill_budget=budget)
    joining = [prompt(k, 300) for k in (1, 2, 3)]
    scheduler._joining = list(joining)
    scheduler._prefill_joining()
    assert executor.chunks == chunks
    assert [call.status is CallStatus.DECODING for call in joining] == started
    # each prefilled call took its first token and became a row, in order
    assert scheduler._rows.calls == [running, *(c for c, s in zip(joining, started, strict=True) if s)]
    assert scheduler._joining == [c for c, s in zip(joining, started, strict=True) if not s]


def test_a_cancelled_joining_call_stops_the_prefills_until_it_is_retired() -> None:
    executor = ApartExecutor()
    scheduler = scheduler_with([new_call([1, 2], drafter=ChainDrafter())], executor)
    first, second = prompt(1, 300), prompt(2, 300)
    first.cancelled = True
    scheduler._joining = [first, second]
    scheduler._prefill_joining()
    assert executor.chunks == []


def test_the_shortest_prompt_goes_first_and_a_long_one_once_passed_over_by_what_it_has_left() -> None:
    executor = ApartExecutor()
    scheduler = scheduler_with([new_call([1, 2], drafter=ChainDrafter())], executor, prefill_budget=1)
    scheduler._joining = [prompt(1, 600), prompt(2, 200)]  # the long one came first
    scheduler._prefill_joining()  # the short one: the long one is passed over by 200
    scheduler._joining.append(prompt(3, 200))
    scheduler._prefill_joining()  # 400 left against 200: the newcomer goes (passed over: 400)
    scheduler._joining.append(prompt(4, 200))
    scheduler._prefill_joining()  # 600 - 400 left against 200: the first come goes
    assert executor.chunks == [(2, 200), (3, 200), (1, 256)]


def test_a_call_submitted_while_prompts_are_prefilled_competes_from_the_next_chunk() -> None:
    executor = ApartExecutor()
    scheduler = scheduler_with([new_call([1, 2], drafter=ChainDrafter())], executor)
    scheduler._joining = [prompt(1, 600)]
    submit(scheduler, prompt(2, 200))  # queued: clients starting together submit a moment apart
    scheduler._prefill_joining()
    assert executor.chunks == [(1, 256), (2, 200), (1, 256), (1, 88)]


@pytest.mark.parametrize(
    ("curve", "chunks"),
    [
        (None, [(1, 600)]),  # costs not measured: whole; the other call joins at the next step
        (CostCurve((1, 256), (35.0, 35.0)), [(1, 600)]),  # a flat forward (a GPU's): whole
        (CostCurve((1, 256), (1.0, 256.0)), [(1, 256), (2, 200), (1, 256), (1, 88)]),
    ],
)
def test_a_prompt_alone_is_chunked_where_that_costs_it_little_so_a_call_arriving_meanwhile_starts_between(
    curve: CostCurve | None, chunks: list[tuple[int, int]]
) -> None:
    executor = ApartExecutor()
    scheduler = scheduler_with([], executor)  # nobody runs
    scheduler.pricing.costs.curve = curve
    scheduler._joining = [prompt(1, 600)]
    submit(scheduler, prompt(2, 200))  # a client a moment behind the long prompt's
    scheduler._prefill_joining()
    assert executor.chunks == chunks and scheduler._joining == []


@pytest.mark.parametrize(
    ("budget", "chunks"),
    [
        (128, []),  # the chunk riding in the step spent it all: the joining prompt waits a step
        (256, [(1, 256)]),  # what it left begins a chunk apart
        (2048, [(1, 256), (1, 44)]),
    ],
)
def test_the_chunks_riding_in_a_step_and_those_apart_spend_one_budget(
    budget: int, chunks: list[tuple[int, int]]
) -> None:
    drafting = new_call([1, 2], drafter=ChainDrafter(3))
    riding = new_call(list(range(400)), prefilled=0)
    executor = ApartExecutor()
    scheduler = scheduler_with([drafting, riding], executor, prefill_budget=budget)
    proposal = DECODERS[drafting].drafter.propose([1, 2], 8)  # type: ignore[union-attr]
    plan = scheduler._rows.plan([drafting, riding], DECODERS, {drafting: proposal})
    assert len(plan.rows[1].draft) == 128  # costs not measured: an equal share of the forward
    scheduler._joining = [prompt(1, 300)]
    scheduler._prefill_joining()
    assert executor.chunks == chunks
    scheduler._prefill_joining()  # the next step's budget: nothing rode in it
    assert len(executor.chunks) == len(chunks) + (1 if budget < 2048 else 0)
