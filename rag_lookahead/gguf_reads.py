"""A GGUF file read once while a built-in model is converted, not once per piece.

transformers reads a GGUF file whole for each piece it takes from it (the config, the
tokenizer, the weights), and maps the weights' names by building the architecture's name table
again for every module of the model; in the `gguf` package, parsing the metadata (a vocabulary
of tens of thousands of strings) and building that table are pure Python. `shared_gguf_reads`
has those three reads share one parse and one table per architecture: the same objects the
library would build each time, read-only, so the converted weights and tokenizer are the same.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["shared_gguf_reads"]


@contextmanager
def shared_gguf_reads() -> Iterator[None]:
    """For the duration, `gguf.GGUFReader` of a path already read and `gguf.get_tensor_name_map`
    of a table already built answer with the earlier object (transformers looks both up in the
    `gguf` package at each call); as they were after. Only around a conversion, which holds its
    model's lock: nothing else in the process reads GGUF files meanwhile."""
    gguf: Any = importlib.import_module("gguf")  # its names are rebound below
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
