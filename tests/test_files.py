"""Atomic writes, and slow work on a file done once across processes (`rag_lookahead.files`)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from rag_lookahead.files import atomic_file, atomic_write, exclusive, held, lock_beside
from rag_lookahead.planning.costs import VERSION, CostCurve, cached_curve


def test_an_atomic_write_replaces_the_file_with_exactly_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text("old", encoding="utf-8")
    atomic_write(path, "é\nnew\n")
    assert path.read_bytes() == "é\nnew\n".encode()
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_file(path) as handle:
        handle.write(b"half")
        raise RuntimeError("crash")
    assert path.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_an_atomic_write_creates_the_file_as_any_other_under_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "a", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o644  # not a temporary file's 0600


def test_the_lock_lies_beside_its_target_and_excludes_another_holder(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model"
    lock = lock_beside(target)
    assert Path(lock.lock_file) == tmp_path / "sub" / ".model.lock"
    got: list[str] = []
    with held(lock):
        waiter = threading.Thread(target=lambda: _hold_then(target, got))
        waiter.start()
        time.sleep(0.05)  # lets the waiter reach the lock; the outcome does not depend on it
        got.append("first")
    waiter.join(timeout=30)
    assert got == ["first", "second"]


def _hold_then(target: Path, got: list[str]) -> None:
    with exclusive(target):
        got.append("second")


def test_without_a_writable_folder_the_work_runs_unlocked(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    ran = []
    with exclusive(blocker / "inside" / "target"):  # its parent cannot be made
        ran.append(True)
    assert ran == [True]


def _curve_path(directory: Path, key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return directory / f"costs-v{VERSION}-{digest}.json"


def _curve_file(directory: Path, key: dict[str, object], measured_at: float) -> None:
    """What another process writes when it has measured: the file `cached_curve` reads."""
    payload = {
        "format": "rag-lookahead-costs",
        "version": VERSION,
        "key": key,
        "measured_at": measured_at,
        "sizes": [1, 2],
        "seconds": [1.0, 1.5],
    }
    _curve_path(directory, key).write_text(json.dumps(payload), encoding="utf-8")


@pytest.mark.parametrize("remeasure", [False, True])
def test_a_process_waiting_for_another_measurement_reads_its_curve(tmp_path: Path, remeasure: bool) -> None:
    key = {"model": "m"}
    measured: list[bool] = []
    got: list[CostCurve] = []

    def measure() -> CostCurve:
        measured.append(True)
        return CostCurve((1,), (2.0,))

    with held(lock_beside(_curve_path(tmp_path, key))):  # another process measuring
        waiter = threading.Thread(
            target=lambda: got.append(cached_curve(tmp_path, key, measure, remeasure=remeasure))
        )
        waiter.start()
        time.sleep(0.05)
        _curve_file(tmp_path, key, time.time())
    waiter.join(timeout=30)
    assert got == [CostCurve((1, 2), (1.0, 1.5))] and not measured


def test_a_remeasurement_does_not_take_a_curve_measured_before_it_asked(tmp_path: Path) -> None:
    key = {"model": "m"}
    _curve_file(tmp_path, key, time.time() - 60)
    curve = cached_curve(tmp_path, key, lambda: CostCurve((1,), (2.0,)), remeasure=True)
    assert curve == CostCurve((1,), (2.0,))
    assert cached_curve(tmp_path, key, lambda: CostCurve((1,), (3.0,))) == curve  # and stored it


def test_a_second_conversion_waits_for_the_first_and_takes_its_model(tmp_path: Path, monkeypatch) -> None:
    from rag_lookahead import models

    monkeypatch.setattr(models.BuiltinModel, "stamp", lambda self: "s")
    converted: list[Path] = []
    monkeypatch.setattr(models, "_convert_into", lambda target, model, progress: converted.append(target))
    target = tmp_path / "models" / f"{models.DEFAULT_MODEL}-s-{models._LAYOUT}"
    got: list[Path] = []
    with held(lock_beside(target)):  # another process converting
        waiter = threading.Thread(
            target=lambda: got.append(models.builtin_model_dir(models.DEFAULT_MODEL, tmp_path))
        )
        waiter.start()
        time.sleep(0.05)
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"")
    waiter.join(timeout=30)
    assert got == [target] and not converted


def test_a_waiting_process_says_so_then_runs_once_the_other_is_done(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "costs.json"
    acquired, said = threading.Event(), threading.Event()
    lines: list[str] = []

    class Stderr:
        def write(self, text: str) -> None:
            lines.append(text)
            said.set()  # the other process finishes only once this one has said that it waits

        def flush(self) -> None:
            pass

    def other() -> None:
        with held(lock_beside(target)):
            acquired.set()
            said.wait(timeout=30)

    holder = threading.Thread(target=other)
    holder.start()
    acquired.wait(timeout=30)
    monkeypatch.setattr("sys.stderr", Stderr())
    with exclusive(target, "waiting for another process ..."):
        ran = True
    holder.join(timeout=30)
    assert ran and "".join(lines) == "waiting for another process ...\n"
