"""The `rag-lookahead` command: `index`, `ask`, `chat`, `demo`, `measure`, `bench`,
`eval-retrieval` and `serve`.

The arguments are parsed first (`rag_lookahead.cli.parser` imports nothing heavy); the module
that runs the command, and torch with it, is imported only then.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from rag_lookahead.cli.parser import build_parser, check_settings

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_settings(args)
        return int(_runner(args.run)(args))
    # A bad index (IndexFormatError) is a ValueError too.
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"rag-lookahead: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _runner(name: str) -> Callable[[argparse.Namespace], int]:
    """The function ``"module:function"`` of this package that runs a command."""
    module, function = name.split(":")
    runner: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"rag_lookahead.cli.{module}"), function
    )
    return runner
