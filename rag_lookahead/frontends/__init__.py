"""What every front end (the LangChain and LlamaIndex adapters, the server, the command line)
decides the same way about its engine: where it comes from (`EngineSource`: an engine given, a
server at a ``base_url``, a model to load, or the default model), its plain twin
(`plain_engine`), and the model's name as users see it (`display_name`).

Apart from `rag_lookahead.protocol` (the OpenAI wire format), which the remote client imports
too: choosing an engine may mean that client, so it sits above both.
"""

from __future__ import annotations

from rag_lookahead.frontends.engines import EngineSource, plain_engine
from rag_lookahead.frontends.names import display_name

__all__ = ["EngineSource", "display_name", "plain_engine"]
