"""`rag-lookahead serve`: the vLLM or SGLang command for a model, printed or run."""

from __future__ import annotations

import argparse
import shlex
import subprocess

from rag_lookahead.server.launch import server_command

__all__ = ["run_serve"]


def run_serve(args: argparse.Namespace) -> int:
    command = server_command(
        args.backend,
        args.model,
        host=args.host,
        port=args.port,
        python=args.python,
        speculative=not args.no_speculation,
    )
    print(shlex.join(command), flush=True)
    if not args.launch:
        api = f"http://{args.host}:{args.port}/v1"
        print(f"# then: ServerEngine(base_url={api!r}, model={args.model!r}, kind={args.backend!r})")
        return 0
    try:
        return subprocess.run(command, check=False).returncode
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{args.python!r} was not found: pass --python with the interpreter of the "
            f"environment {args.backend} is installed in"
        ) from None
