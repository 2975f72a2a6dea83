"""Every benchmark script runs: on a tiny random model, with its smallest arguments, in this
process (as ``__main__``), writing only where the test says; and it touches the library through
public names only (no private attribute, no monkeypatching of the library).

The scripts otherwise run only by hand, on a quiet machine: a renamed or removed internal they
use would surface only then. Nothing here asserts on how long anything took.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.testing import save_tiny_model

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# A script runs as __main__; its neighbours without that (the replay tools' library) are imported.
SCRIPTS = sorted(path for path in BENCHMARKS.glob("*.py") if "__main__" in path.read_text())

# Each script's smallest run on the tiny model: its arguments, one line per run (several for a
# script with sub-commands or modes), in order. Filled in: {model} (a saved tiny random model and its
# tokenizer), {data} (a few short records), {out} (a file under the test's folder), {tmp} (the
# test's folder), {recorded} (greedy answers, `replay.py record`), {curve} (a cost curve's JSON),
# {grid} and {bench} (committed JSON, read only).
SMOKE: dict[str, list[str]] = {
    "bm25_choice.py": ["--child bm25s --data {data}"],  # one library's process, here
    # (torch.compile's variants take minutes to compile even a tiny model: the eager ones)
    "captured_engine.py": [  # a static step on a CPU, where the engine builds one; no compiled greedy
        "--model {model} --data {data} --limit 1 --clients 2 --max-new-tokens 4 --step static"
        " --baseline-methods off --reps 1 --context 16 --threads 1 --json {out}"
    ],
    "static_step_cpu.py": [  # the eager variants (compiling takes minutes even for a tiny model)
        "--model {model} --context 8 --buckets 1x1,2x4 --eager-max-lens 32 --modes '' --reps 1 --rounds 1"
        " --threads 1 --json {out}"
    ],
    "compiled_forward.py": [
        "--model {model} --context 8 --widths 1,2 --reps 1 --threads 1 --variants eager-torch,eager-onednn"
        " --json {out}"
    ],
    "decode_step.py": [
        "--model {model} --data {data} --limit 1 --max-new-tokens 3 --rounds 1 --threads 1 --kernels torch"
        " --json {out}"
    ],
    "direct_forward.py": [
        "--model {model} --contexts 8 --widths 1,2 --reps 1 --rounds 1 --threads 1 --json {out}"
    ],
    "extraction.py": ["--model {model} --data {data} --limit 1 --max-new-tokens 8 --threads 1 --json {out}"],
    "first_long_prompt.py": ["--child --model {model} --data {data} --limit 1 --repeats 1"],  # one process's
    "flat_curve_plan.py": [
        "--model {model} --data {data} --curve-from {bench} --limit 1 --max-new-tokens 6 --threads 1"
        " --json {out}"
    ],
    "grammar_choice.py": ["--library llguidance --model-dir {model} --repeat 1"],  # one library's process
    "hindsight.py": ["{recorded} --curve {curve} --depth 4 --min-match 1"],
    "host_work.py": [
        "--model {model} --data {data} --clients 2 --max-new-tokens 6 --threads 1 --profile 3",
        "--parts --clients 2 --repeats 1",
        "--drafts --model {model} --data {data} --records 1 --max-new-tokens 3",
    ],
    "join_plan.py": ["--model {model} --prompt 48 --threads 1"],
    "joined_step.py": ["--model {model} --lengths 20,30 --chunk 8 --repeats 3 --threads 1 --json {out}"],
    "kernel_choice.py": ["--model {model} --rounds 1 --reps 1 --context 16 --threads 1 --json {out}"],
    "linear_kernels.py": ["--model {model} --repeats 1 --context 8 --rows 2 --widths 1,2 --threads 1"],
    "loaded_curve.py": [
        "--model {model} --data {data} --limit 1 --max-new-tokens 3 --threads 1 --curve loaded --json {out}"
    ],
    "lone_prompt.py": [  # one process's run
        "--child --model {model} --data {data} --clients 2 --max-new-tokens 3 --repeats 1 --threads 1"
        " --lead 0"
    ],
    "packed_steps.py": ["--model {model} --lengths 20,30 --sizes 1,2 --repeats 3 --threads 1 --json {out}"],
    "prefix_reuse.py": [
        "--model {model} --data {data} --questions 2 --clients 2 --max-new-tokens 3 --cache-mb 8 --threads 1"
        " --json {out}"
    ],
    "prefix_tokens.py": ["--model {model} --data {data} --limit 2"],
    "reader_threads.py": ["--model {model} --context 32 --tokens 3 --rounds 1 --threads 1"],
    "replay.py": [
        "record --model {model} --data {data} --limit 2 --max-new-tokens 6 --threads 1 --out {out}",
        "replay {recorded} --curve {curve}",
        "batch {recorded} --grid {grid} --clients 2",
    ],
    "retained_memory.py": [  # one process's run, glibc as it comes (the other way tunes this process's)
        "--way default --model {model} --data {data} --limit 2 --clients 2 --max-new-tokens 3 --threads 1"
    ],
    "retrieval_build.py": ["--child {data} --threads 1"],  # one build's process, here
    "retrieval_chunks.py": ["{data}"],
    "scaling.py": ["--smallest --model {model} --data {data} --records 1 --threads 1 --json {out}"],
    "sentence_splitter.py": ["{data} --rounds 1 --json {out}"],
    "soak.py": ["--model {model} --data {data} --queries 2 --max-new-tokens 3 --threads 1 --json {out}"],
    "soak_faults.py": [
        "--model {model} --data {data} --questions 2 --threads 2 --max-new-tokens 3 --torch-threads 1"
        " --json {out}"
    ],
    "step_costs.py": [
        "--model {model} --data {data} --widths 1,2 --rows 1,2 --rounds 1 --context 200 --threads 1"
        " --json {out}"
    ],
    "step_trace.py": [
        "--json {out} -- bench --model {model} --data {data} --limit 2 --max-new-tokens 4 --threads 1"
        " --mode trie --concurrency 2 --methods batched"
    ],
    "thread_teams.py": ["--model {model} --threads 1 --json {out}"],
    # vLLM is not installed here: every fact null, and why
    "vllm_facts.py": ["--model {model} --methods '{{\"vllm_plain\": null}}' --out {out}"],
    "vllm_peer.py": [  # this engine's methods (vLLM is not installed here)
        "--model {model} --data {data} --limit 2 --max-new-tokens 3 --clients 2 --threads 1"
        " --methods local_plain,local_lookahead --out-dir {tmp} --log-dir {tmp}"
    ],
}
# Run in a process of their own: they tune the C allocator of the process that runs them
# (`retain_freed_memory`) and reserve its heap, as `rag-lookahead serve` does.
APART = {"lone_prompt.py", "vllm_peer.py"}

# Scripts not run here, each with the reason (and what runs it instead).
SKIPPED: dict[str, str] = {
    "predicted_outputs.py": "runs in tests/test_predicted_outputs_bench.py (--quick, on tiny models)",
    "step_profile.py": "runs in tests/test_step_profile.py (--quick, on a tiny model)",
    "tables.py": "runs in tests/test_benchmark_tables.py (--check, and its charts drawn)",
    "load_and_step.py": "no run small enough yet: it always loads the default model (SmolLM2) too",
}

# Short ASCII records (the tiny model reads one character a token, 512 at most): enough of them
# for the scripts that fill a trie with the contexts no prompt uses (`scaling.py`).
_THINGS = ("cat", "dog", "bird", "fish", "lamp", "book", "cup", "key")
_PLACES = ("mat", "desk", "shelf", "box", "bed", "door")
TINY_RECORDS = [
    {
        "id": f"tiny-{n}",
        "question": f"Where is the {_THINGS[n % 8]}?",
        "context": f"The {_THINGS[n % 8]} is on the {_PLACES[n % 6]}. The {_THINGS[(n + 3) % 8]} is "
        f"by the {_PLACES[(n + 1) % 6]}, near {n} old {_THINGS[(n + 5) % 8]}s.",
        "answer": f"On the {_PLACES[n % 6]}.",
    }
    for n in range(24)
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What every run reads: the tiny model, the records, a cost cache shared by the runs (the
    first run that needs costs measures them, the others read them back)."""
    root = tmp_path_factory.mktemp("benchmarks")
    data = root / "tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TINY_RECORDS), encoding="utf-8")
    curve = root / "curve.json"
    curve.write_text(json.dumps({"sizes": [1, 2, 4, 8, 16], "seconds": [1.0, 1.1, 1.3, 1.8, 2.9]}))
    return {
        "model": save_tiny_model(root / "tiny-model"),
        "data": data,
        "curve": curve,
        "cache": root / "cache",
        "recorded": root / "recorded.json",
        "grid": BENCHMARKS / "step-grid-cpu-2026-12-02.json",
        "bench": BENCHMARKS / "cuda" / "cuda-smollm2-dolly_context_qa.json",
    }


@pytest.fixture
def quiet_threads() -> Iterator[None]:
    """The scripts set torch's thread counts (here, and in the model's thread): put them back."""
    main, model = torch.get_num_threads(), ModelThread.shared().call(torch.get_num_threads)
    yield
    torch.set_num_threads(main)
    ModelThread.shared().call(lambda: torch.set_num_threads(model))


def _committed() -> dict[Path, tuple[int, int]]:
    return {
        path: (path.stat().st_size, path.stat().st_mtime_ns)
        for path in BENCHMARKS.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def run_script(script: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``script`` run as ``__main__`` with ``argv``; what it printed. It fails the test by
    raising or exiting with a nonzero status."""
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # scripts import their neighbours
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exit_:
            assert exit_.code in (0, None), f"{script.name} {' '.join(argv)}: exit {exit_.code}"
    return printed.getvalue()


def run_apart(script: Path, argv: list[str], folder: Path) -> str:
    """``script`` run with ``argv`` by this interpreter in a process of its own (in ``folder``,
    with this process's environment); what it printed."""
    done = subprocess.run(
        [sys.executable, str(script), *argv], cwd=folder, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{script.name} {' '.join(argv)}: exit {done.returncode}\n{done.stderr}"
    return done.stdout


def _filled(line: str, places: dict[str, Path]) -> list[str]:
    return [arg.format(**{k: str(v) for k, v in places.items()}) for arg in shlex.split(line)]


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) > 10


def test_every_script_has_a_smoke_run_or_a_reason() -> None:
    names = {path.name for path in SCRIPTS}
    assert names - SMOKE.keys() - SKIPPED.keys() == set(), "add a smoke run (SMOKE) or a reason (SKIPPED)"
    assert SMOKE.keys() & SKIPPED.keys() == set()
    assert (SMOKE.keys() | SKIPPED.keys()) - names == set(), "a script listed here is gone"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_benchmark_script_runs_on_the_tiny_model(
    script: Path,
    lab: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    quiet_threads: None,
) -> None:
    if script.name in SKIPPED:
        pytest.skip(SKIPPED[script.name])
    monkeypatch.setenv("XDG_CACHE_HOME", str(lab["cache"]))  # costs and kernels: the module's own
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # a relative path a script writes lands here
    before = _committed()
    for n, line in enumerate(SMOKE[script.name]):
        if "{recorded}" in line and not lab["recorded"].exists():
            record = _filled(SMOKE["replay.py"][0], {**lab, "out": lab["recorded"]})  # replay's own first run
            run_script(BENCHMARKS / "replay.py", record, monkeypatch)
        out = tmp_path / f"out-{n}.json"
        argv = _filled(line, {**lab, "out": out, "tmp": tmp_path})
        if script.name in APART:
            run_apart(script, argv, tmp_path)
        else:
            run_script(script, argv, monkeypatch)
        if "{out}" in line:
            assert out.exists(), f"{script.name} wrote nothing to {out}"
    assert _committed() == before, "a benchmark run changed or added files under benchmarks/"
    if script.name == "vllm_peer.py":
        _check_peer_record(json.loads((tmp_path / "vllm-peer-tiny.json").read_text()))


def _check_peer_record(record: dict[str, object]) -> None:
    """The peer benchmark's JSON says what this engine ran on (its `Backend`), and has no vLLM
    record when no vLLM method ran."""
    assert record["vllm"] is None
    engine = record["engine"]
    assert isinstance(engine, dict) and set(engine) == {"local_plain", "local_lookahead"}
    for started in engine.values():
        assert isinstance(started[0]["backend"], dict) and started[0]["backend"]


@pytest.mark.parametrize("name", sorted(SKIPPED))
def test_a_script_not_run_here_still_starts(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its imports resolve and its options parse (``--help``), at least."""
    script = BENCHMARKS / name
    if not script.exists():
        pytest.fail(f"{name} is gone: drop it from SKIPPED")
    assert "usage:" in run_script(script, ["--help"], monkeypatch)


# ------------------------------------------------------------------ public names only

_SELF = {"self", "cls"}


def _rag_names(tree: ast.Module) -> set[str]:
    """The names a script binds to the library: what it imports from it (modules and names), and
    the variables and parameters it assigns from those or annotates with them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rag_lookahead"):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("rag_lookahead")
            }
    for _ in range(3):  # a few rounds of `engine = LookaheadEngine(...)`, `runner = engine.runner`
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                if _root(node.value) in names:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} - _SELF
            elif (
                isinstance(node, ast.arg)
                and node.annotation is not None
                and node.arg not in _SELF
                and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.annotation))
            ):
                names.add(node.arg)
    return names


def _root(node: ast.AST) -> str | None:
    """The name an expression such as ``a.b(c).d[0]`` starts from."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Await):
            node = node.value
        else:
            return None


def private_uses(source: str, neighbours: frozenset[str] = frozenset()) -> list[str]:
    """Where ``source`` (a script) reaches past the public names: a private attribute of
    anything but its own objects (``self``) and third-party modules, a private name imported,
    an attribute of the library assigned (a monkeypatch), or ``setattr``/``delattr`` at all.
    ``neighbours`` are the scripts beside it, whose private names are theirs alone too."""
    tree = ast.parse(source)
    rag = _rag_names(tree)
    third_party = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if not alias.name.startswith("rag_lookahead")
    } - neighbours
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = _root(node)
            if root not in _SELF and (root not in third_party or root in rag):
                found.append(f"{where}: private attribute .{node.attr} ({ast.unparse(node)})")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{where}: private name {alias.name} imported from {node.module}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and _root(target) in rag:
                    found.append(f"{where}: the library's {ast.unparse(target)} assigned")
        elif isinstance(node, ast.Call) and _patches(node.func):
            found.append(f"{where}: {ast.unparse(node.func)}(...)")
    return found


def _patches(func: ast.expr) -> bool:
    """Whether a call of ``func`` sets or deletes an attribute by name (``setattr``, a test's
    ``monkeypatch.setattr``): in a script, only ever a monkeypatch."""
    if isinstance(func, ast.Name):
        return func.id in ("setattr", "delattr")
    return isinstance(func, ast.Attribute) and func.attr in ("setattr", "delattr")


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_a_benchmark_script_uses_public_names_only(script: Path) -> None:
    neighbours = frozenset(path.stem for path in BENCHMARKS.glob("*.py"))
    assert private_uses(script.read_text(encoding="utf-8"), neighbours) == []


@pytest.mark.parametrize(
    "source",
    [
        "from rag_lookahead.engine.scheduler import Scheduler\nScheduler._iterate = None\n",
        "from rag_lookahead import LookaheadEngine\ne = LookaheadEngine(m, t)\nprint(e.scheduler._rows)\n",
        "from rag_lookahead import LookaheadEngine\ne = LookaheadEngine(m, t)\nr = e.runner\nr.forward = f\n",
        "from rag_lookahead.runtime import attention\nattention.SPLIT = 2\n",
        "import rag_lookahead.runtime.kernels\nrag_lookahead.runtime.kernels._CHOSEN.clear()\n",
        "from neighbour import _helper\n",
        "import neighbour\nneighbour._helper()\n",
        "from rag_lookahead import LookaheadEngine\ndef f(e: LookaheadEngine) -> None:\n    e.config = 1\n",
        "setattr(thing, 'name', 1)\n",
    ],
)
def test_the_check_finds_a_private_use(source: str) -> None:
    assert private_uses(source, frozenset({"neighbour"}))


def test_the_check_lets_a_script_s_own_objects_and_torch_be() -> None:
    source = (
        "import torch\nfrom dataclasses import dataclass\n"
        "class Clock:\n    def __init__(self) -> None:\n        self._start = 0\n"
        "torch._dynamo.reset()\nargs.model = 'x'\nrow.seconds = 1.0\n"
    )
    assert private_uses(source) == []


SHELL_SCRIPTS = sorted(BENCHMARKS.rglob("*.sh"))


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda path: path.name)
def test_a_shell_script_parses_and_its_python_imports_resolve(script: Path) -> None:
    """The GPU scripts run only where a GPU is lent: their syntax and the names their inline
    Python imports are checked here."""
    subprocess.run(["bash", "-n", str(script)], check=True)
    for names in re.findall(r"^from (rag_lookahead[\w.]*) import (.+)$", script.read_text(), re.MULTILINE):
        module = importlib.import_module(names[0])
        for name in names[1].split(","):
            assert hasattr(module, name.strip()), f"{script.name}: {names[0]} has no {name.strip()}"
