"""`ask --json`, the mark of an answer cut at the token limit, `chat`'s history and `--debug`
without special tokens: the commands over a tiny random model (it never ends an answer, so every
answer is cut) and a small index, with the model loading replaced; a command whose reader leaves
early ends quietly; and one spelling of each option in every command and example, the older
spellings still accepted."""

import json
import subprocess
import sys
from subprocess import PIPE

import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.cli import build_parser, main
from rag_lookahead.cli.answers import _undrafted_line
from rag_lookahead.rag import DocumentIndex, RagPipeline, RetrievalConfig, SentenceTransformerEmbedder
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.testing import ASCII_VOCAB, AsciiTokenizer, load_example, tiny_model

DOCS = {
    "bees.txt": "Honeybees dance to show where flowers are.",
    "bread.txt": "Feed a sourdough starter once a day.",
}
QUESTION = "How often is a sourdough starter fed?"


class SpecialsShown(AsciiTokenizer):
    """Shows an end-of-turn token unless told to skip special tokens."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        text = super().decode(ids)
        return text if skip_special_tokens else text + "<|eot|>"


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> DocumentIndex:
    corpus = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (corpus / name).write_text(text)
    return DocumentIndex.build([corpus], SentenceTransformerEmbedder())[0]


@pytest.fixture
def pipelines(index, monkeypatch) -> list[RagPipeline]:
    """The pipelines the commands ran with (a fresh one per command)."""
    made: list[RagPipeline] = []

    def make(args) -> RagPipeline:
        model = tiny_model("llama", 0, ASCII_VOCAB)
        engine = LookaheadEngine(model, SpecialsShown(), LookaheadConfig(mode="trie", min_query_length=1))
        made.append(RagPipeline(engine, index, RetrievalConfig(top_k=1), system_prompt=None))
        return made[-1]

    monkeypatch.setattr("rag_lookahead.cli.answers.make_pipeline", make)
    return made


def ask(*flags: str) -> int:
    return main(["ask", "--index", "unused", QUESTION, "--max-new-tokens", "8", *flags])


def chat(lines: list[str], monkeypatch, *flags: str) -> int:
    given = iter(lines)
    monkeypatch.setattr("builtins.input", lambda prompt="": next(given))
    return main(["chat", "--index", "unused", *flags])


def test_ask_json_prints_one_object_and_nothing_else(pipelines, capsys) -> None:
    assert ask("--json") == 0
    out = capsys.readouterr().out
    reply = json.loads(out)  # the whole of stdout
    assert set(reply) == {"question", "answer", "sources", "notes", "finish_reason", "stats"}
    assert reply["question"] == QUESTION and reply["finish_reason"] == "length"
    assert reply["stats"]["new_tokens"] == 8 and reply["stats"]["finish_reason"] == "length"
    assert {"tokens_per_s", "tokens_per_step", "accepted_per_step"} <= set(reply["stats"])
    [source] = reply["sources"]
    assert source["id"] == 1 and source["title"] == "bread.txt" and source["source"].endswith("bread.txt")
    assert source["text"] == DOCS["bread.txt"] and 0 < source["similarity"] <= 1
    assert "sources:" not in out and "[cut" not in out


def test_ask_and_json_and_debug_are_exclusive(capsys) -> None:
    with pytest.raises(SystemExit):
        ask("--json", "--debug")
    assert "not allowed with" in capsys.readouterr().err


def test_an_answer_cut_at_the_token_limit_is_marked(pipelines, capsys) -> None:
    assert ask() == 0
    out = capsys.readouterr().out
    assert "[cut at --max-new-tokens 8: the answer may be incomplete]" in out
    assert out.index("[cut at") < out.index("sources:")


def test_debug_shows_no_special_tokens(pipelines, capsys) -> None:
    assert ask("--debug") == 0
    out = capsys.readouterr().out
    assert "<|eot|>" not in out and "sources:" in out
    assert "forwards without a draft:" in out or "[every forward verified a draft]" in out


def test_debug_says_why_drafting_was_off() -> None:
    steps = {"not_worth_it": 5, "no_draft": 2}
    off = DecodeStats(3, 8, 7, (0,) * 7, (0,) * 7, ("none",) * 7, 0.1, 0.2, "length", undrafted_steps=steps)
    line = _undrafted_line(off)
    assert line == "[drafting off (not_worth_it): forwards without a draft: 2 no_draft, 5 not_worth_it]"
    some = DecodeStats(3, 8, 2, (4, 0), (4, 1), ("trie", "trie"), 0.1, 0.2, "length")
    assert _undrafted_line(some) == "[every forward verified a draft]"


# A command's output after its reader left (`rag-lookahead ask ... | head -c 1`): what it does,
# run as a process of its own (the pipe is stdout's file descriptor).
LEFT_PIPE = """
import sys
import rag_lookahead.cli.answers as answers

def run(args):
    print("a", flush=True)
    sys.stdin.readline()  # the reader has gone
    print("b" * WIDTH)
    return 0

answers.run_ask = run
from rag_lookahead.cli import main
sys.exit(main(["ask", "--index", "unused", "q"]))
"""


@pytest.mark.parametrize(
    "width", [1, 1 << 20], ids=["held in the buffer to the end", "written while the command runs"]
)
def test_a_reader_that_leaves_early_ends_the_command_quietly(width: int) -> None:
    command = [sys.executable, "-c", LEFT_PIPE.replace("WIDTH", str(width))]
    with subprocess.Popen(command, stdin=PIPE, stdout=PIPE, stderr=PIPE) as process:
        assert process.stdout is not None and process.stdin is not None and process.stderr is not None
        assert process.stdout.read(1) == b"a"
        process.stdout.close()
        process.stdin.write(b"\n")
        process.stdin.close()
        err = process.stderr.read().decode()
        code = process.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert code == 1  # as Python's own recipe exits: the output was cut


def test_chat_answers_each_question_after_the_earlier_turns(pipelines, capsys, monkeypatch) -> None:
    prompts: list[str] = []
    prepare = RagPipeline.prepare

    def seen(self, question, max_new_tokens, history=()):
        query = prepare(self, question, max_new_tokens, history)
        prompts.append(self.engine.tokenizer.decode(query.prompt_ids, skip_special_tokens=True))
        return query

    monkeypatch.setattr(RagPipeline, "prepare", seen)
    follow_up = "And the bees?"
    assert chat([QUESTION, follow_up, ""], monkeypatch, "--max-new-tokens", "8") == 0
    out = capsys.readouterr().out
    first_answer = out.split("ends.\n")[1].split("\n")[0]  # the line after the greeting
    assert len(prompts) == 2 and follow_up not in prompts[0]
    assert prompts[1].index(QUESTION) < prompts[1].index(follow_up)
    assert first_answer.strip() and first_answer.strip() in prompts[1]
    assert "oldest turn" not in out


def test_chat_drops_the_oldest_turns_that_no_longer_fit(pipelines, capsys, monkeypatch) -> None:
    # 512 positions: a 300-token answer leaves no room for itself in the next prompt.
    assert chat([QUESTION, QUESTION, ""], monkeypatch, "--max-new-tokens", "300") == 0
    out = capsys.readouterr().out
    assert out.count("sources:") == 2
    assert "note: The 1 oldest turn(s) of the conversation were left out to fit the context window." in out


def test_history_turns_are_kept_while_they_fit(index) -> None:
    model = tiny_model("llama", 0, ASCII_VOCAB)
    engine = LookaheadEngine(model, AsciiTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    pipeline = RagPipeline(engine, index, RetrievalConfig(top_k=1), system_prompt=None)
    turns = [(f"question {i}?", "x" * 60) for i in range(6)]
    query = pipeline.prepare(QUESTION, 100, turns)
    [note] = query.notes
    dropped = int(note.split()[1])
    text = engine.tokenizer.decode(query.prompt_ids)
    assert 0 < dropped < 6 and f"question {dropped}?" in text and f"question {dropped - 1}?" not in text
    assert len(query.prompt_ids) <= 512 - 100 and query.sources


# One spelling of each option in every command and example (transformers' names), the older
# spellings still accepted but not listed in --help.
COMMANDS_WITH_BOTH = {
    "ask": ["ask", "q", "--index", "i"],
    "chat": ["chat", "--index", "i"],
    "demo": ["demo"],
    "bench": ["bench", "--data", "d"],
}
# Each example with the package it needs beyond the core.
EXAMPLE_SCRIPTS = {
    "langchain_rag.py": "langchain_rag_lookahead",
    "langgraph_agent.py": "langgraph",
    "llamaindex_rag.py": "llama_index.llms.rag_lookahead",
    "llamaindex_agent.py": "llama_index.llms.rag_lookahead",
}


@pytest.mark.parametrize("command", COMMANDS_WITH_BOTH)
def test_every_command_takes_the_canonical_names_and_the_old_ones(command: str) -> None:
    parser = build_parser()
    base = COMMANDS_WITH_BOTH[command]
    canonical = parser.parse_args([*base, "--max-new-tokens", "7", "--top-k", "3"])
    old = parser.parse_args([*base, "--max-tokens", "7", "--k", "3"])
    default = parser.parse_args(base)
    assert (canonical.max_new_tokens, canonical.top_k) == (old.max_new_tokens, old.top_k) == (7, 3)
    assert (default.max_new_tokens, default.top_k) == (128, RetrievalConfig().top_k)


@pytest.mark.parametrize("command", [*COMMANDS_WITH_BOTH, "measure"])
def test_help_lists_only_the_canonical_names(command: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--max-new-tokens" in out and "--max-tokens" not in out and "--k " not in out
    assert ("--top-k" in out) == (command != "measure")


def test_an_old_name_is_checked_like_the_canonical_one(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["ask", "q", "--index", "i", "--k", "-3"])
    assert "argument --k: must be a positive integer" in capsys.readouterr().err


def test_the_old_and_the_canonical_name_together_last_wins() -> None:
    args = build_parser().parse_args(["ask", "q", "--index", "i", "--top-k", "2", "--k", "5"])
    assert args.top_k == 5


@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS)
def test_every_example_takes_the_canonical_names_and_the_old_ones(script: str, capsys) -> None:
    pytest.importorskip(EXAMPLE_SCRIPTS[script])
    example = load_example(script)
    with pytest.raises(SystemExit):
        example.main(["--help"])
    help_text = capsys.readouterr().out
    assert "--max-new-tokens" in help_text and "--top-k" in help_text
    assert "--max-tokens" not in help_text and "--k " not in help_text
    # A bad value stops the parse before anything loads, naming the spelling that was read.
    for flag in ("--max-new-tokens", "--max-tokens", "--top-k", "--k"):
        with pytest.raises(SystemExit):
            example.main([flag, "many"])
        assert f"argument {flag}: invalid int value: 'many'" in capsys.readouterr().err
