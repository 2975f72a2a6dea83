"""The option names shared by every command and example: one canonical spelling each, the names
transformers uses (``--max-new-tokens``, ``--top-k``), listed in ``--help``; the other spellings
that commands used before are still accepted, unlisted, so that no script that passes them breaks."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["ALIASES", "add_max_new_tokens", "add_top_k"]

# Canonical flag -> spellings accepted for it but not listed in --help.
ALIASES: dict[str, tuple[str, ...]] = {
    "--max-new-tokens": ("--max-tokens",),
    "--top-k": ("--k",),
}

_Adder = argparse.ArgumentParser | argparse._ArgumentGroup


def add_max_new_tokens(parser: _Adder, *, type: Callable[[str], Any] = int, default: int, help: str) -> None:
    """``--max-new-tokens N`` (also ``--max-tokens N``): the most new tokens per answer or turn."""
    _add_with_aliases(parser, "--max-new-tokens", type=type, default=default, help=help)


def add_top_k(parser: _Adder, *, type: Callable[[str], Any] = int, default: int, help: str) -> None:
    """``--top-k K`` (also ``--k K``): how many chunks or nodes are retrieved."""
    _add_with_aliases(parser, "--top-k", type=type, default=default, help=help)


def _add_with_aliases(
    parser: _Adder, flag: str, *, type: Callable[[str], Any], default: int, help: str
) -> None:
    dest = flag.lstrip("-").replace("-", "_")
    parser.add_argument(flag, dest=dest, type=type, default=default, help=help)
    # A separate action, so that --help lists only the canonical name; its default is SUPPRESS
    # so that it never overwrites the canonical flag's default, and an error names the spelling used.
    parser.add_argument(
        *ALIASES[flag], dest=dest, type=type, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
