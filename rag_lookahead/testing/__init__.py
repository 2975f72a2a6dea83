"""Helpers the test suites share (the core's, both integrations', the benchmarks' smoke tests):
tiny random models and tokenizers (`models`), the README-block runner (`readme`), a stub
OpenAI-compatible server (`stub_server`), this project's server in a thread (`local_server`)
and an engine's loop held still while a test looks at a call in flight (`holding`). For tests
only: they may change without notice.
"""

from __future__ import annotations

# The models' names are the package's (they were `rag_lookahead.testing` before it was a folder).
from rag_lookahead.testing.models import *  # noqa: F403
from rag_lookahead.testing.models import __all__ as __all__
