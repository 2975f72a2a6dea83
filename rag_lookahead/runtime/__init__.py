"""What runs the model: the `ModelRunner` (the only code that calls it), the direct forward
of Llama-shaped models, its attention and linear kernels, the KV caches a draft tree is
verified over (one call's, the batch's rows, past prompts' prefixes), and the probe of whether
a model verifies trees."""

from rag_lookahead.runtime.runner import ModelRunner

__all__ = ["ModelRunner"]
