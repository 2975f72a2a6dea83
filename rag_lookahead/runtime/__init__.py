"""What runs the model: the `ModelRunner` (the only code that calls it) on the `Backend` it is
given, the direct forward of Llama-shaped models, its attention and linear kernels, the KV
caches a draft tree is verified over (one call's, the batch's rows, past prompts' prefixes).
What it runs on is chosen above it, by the tuning wing (`rag_lookahead.tuning`)."""

from rag_lookahead.runtime.runner import ModelRunner

__all__ = ["ModelRunner"]
