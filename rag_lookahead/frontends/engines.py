"""The engine a front end decodes with, from what its user gave: an engine, a server at a
``base_url``, a model to load (`LoadOptions`), or nothing (the default model).

`EngineSource` is that choice, checked when made (a front end's settings are refused at once,
nothing loads) and resolved when the engine is needed (`EngineSource.resolve`): every adapter
accepts the same combinations, refuses the same others with the same words, and names the
model the same way.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rag_lookahead.config import LookaheadConfig, check_variant
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.frontends.names import display_name
from rag_lookahead.interface import Engine
from rag_lookahead.loading import LoadOptions
from rag_lookahead.models import DEFAULT_MODEL, is_missing_directory
from rag_lookahead.remote.config import ServerConfig

__all__ = ["EngineSource", "plain_engine"]

_PLAIN_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class EngineSource:
    """Where a front end's engine comes from: one given, a server, or a model loaded offline.

    Attributes:
        engine: An engine to use (a `LookaheadEngine`, a `ServerEngine`...); excludes the rest.
        load: The model to load when neither an engine nor a server is given. With
            ``base_url``, only its ``model`` is taken: the served model's name.
        base_url: An OpenAI-compatible server's API root (``http://localhost:8000/v1``) to
            answer on, through a `ServerEngine`.
        server: With ``base_url``, `ServerConfig`'s other fields (``kind``, ``api_key``,
            ``max_retries``, ``context_window``...); ``None`` values are its defaults. A value
            given without ``base_url`` is an error: it would go unused.
        timeout: With ``base_url``, the server's `ServerConfig.timeout`; without, the seconds
            a whole call may take (`deadline`).
        lookahead_config: A local engine's drafting settings: the loaded model's, or those of
            a given `LookaheadEngine`'s variant (`LookaheadEngine.with_config`), which may
            differ from the engine's own in per-call settings only (`check_variant`); ``None``:
            the engine's own, or the defaults.
        lookahead: ``False`` decodes plainly (drafting mode ``"off"``); a server decides that
            itself.
        progress: Show progress bars while a model loaded here is converted and its costs
            measured (the waits of a front end's first call), as `LoadOptions.progress` does:
            only when standard error is a terminal. On by default, unlike the library's own
            calls: a front end's user did not ask to load anything and would otherwise wait on
            a blank screen. A given engine keeps its own setting; a server loads nothing.
    """

    engine: Engine | None = None
    load: LoadOptions = field(default_factory=LoadOptions)
    base_url: str | None = None
    server: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    lookahead_config: LookaheadConfig | None = None
    lookahead: bool = True
    progress: bool = True
    _server: ServerConfig | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = self.load.given()
        if self.engine is not None and self.base_url is not None:
            raise ValueError(
                "takes either an engine or a server, not both: pass either `engine` or `base_url`"
            )
        if self.engine is not None and given:
            raise ValueError(
                "takes either an engine or options to load one, not both: "
                f"pass either `engine` or {', '.join(given)}"
            )
        if not isinstance(self.progress, bool):
            raise TypeError(f"progress must be True or False, got {self.progress!r}")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not self.timeout > 0):
            raise ValueError(f"timeout must be a number of seconds above 0 or None, got {self.timeout!r}")
        unused = sorted(name for name, value in self.server.items() if value is not None)
        if self.base_url is not None:
            object.__setattr__(self, "_server", self._server_config(given))
        elif unused:
            raise ValueError(f"{unused} apply to a server: pass `base_url` too")
        model = self.load.model
        if self.engine is None and self.base_url is None and model and is_missing_directory(model):
            raise ValueError(f"model {model!r} is not a model directory")
        if self.lookahead_config is not None and _foreign(self.engine):
            raise ValueError("`lookahead_config` applies to a local LookaheadEngine, not to this engine")
        if self.lookahead_config is not None and isinstance(self.engine, LookaheadEngine):
            check_variant(self.engine.config, self.lookahead_config)  # refused here, not at a first call

    def _server_config(self, given: list[str]) -> ServerConfig:
        if not self.load.model:
            raise ValueError("with `base_url`, `model` is the served model's name")
        local = [name for name in given if name != "model"]
        local += ["lookahead_config"] if self.lookahead_config is not None else []
        if local:
            raise ValueError(f"{local} apply to a local model, not to a server at `base_url`")
        if not self.lookahead:
            raise ValueError(
                "a server decides its own speculative decoding; `lookahead=False` needs a local model"
            )
        settings = {name: value for name, value in self.server.items() if value is not None}
        if self.timeout is not None:
            settings["timeout"] = self.timeout
        assert self.base_url is not None
        return ServerConfig(self.base_url, self.load.model, **settings)

    @property
    def model_name(self) -> str:
        """The model's name as every front end shows it, known before anything loads."""
        if self.engine is not None:
            return display_name(self.engine)
        return self.load.model or DEFAULT_MODEL

    @property
    def config(self) -> LookaheadConfig | None:
        """The drafting settings calls run with (mode ``"off"`` without lookahead); ``None``
        on a server, which drafts by its own settings."""
        config = self.lookahead_config
        if config is None:
            if self.base_url is not None or _foreign(self.engine):
                return None
            config = self.engine.config if isinstance(self.engine, LookaheadEngine) else LookaheadConfig()
        return config if self.lookahead else dataclasses.replace(config, mode="off")

    @property
    def deadline(self) -> float | None:
        """The seconds a whole call may take (a server's ``timeout`` is the server's own)."""
        return None if self.base_url is not None else self.timeout

    def resolve(self) -> Engine:
        """The engine: a new `ServerEngine`, the model loaded, or the given engine (its variant
        with `config` where that differs, its `plain` twin without lookahead)."""
        if self._server is not None:
            from rag_lookahead.remote import ServerEngine

            server = self._server
            return ServerEngine(**{f.name: getattr(server, f.name) for f in dataclasses.fields(server)})
        config = self.config
        if self.engine is None:
            load = dataclasses.replace(self.load, progress=self.load.progress or self.progress)
            return LookaheadEngine.from_pretrained(config=config, load=load)
        if not isinstance(self.engine, LookaheadEngine):
            return self.engine if self.lookahead else plain_engine(self.engine)
        if self.engine.config == config:
            return self.engine
        assert config is not None
        return self.engine.with_config(config)  # the same model, runner, trie and batches


def plain_engine(engine: Engine) -> Engine:
    """``engine``'s twin that never drafts (one per engine, kept while the engine lives): the
    same model, runner and trie, for a call without lookahead."""
    plain = _PLAIN_ENGINES.get(engine)
    if plain is None:
        plain = _PLAIN_ENGINES.setdefault(engine, engine.plain())
    return plain


def _foreign(engine: Engine | None) -> bool:
    """Whether ``engine`` is given and is not a local `LookaheadEngine` (a server's)."""
    return engine is not None and not isinstance(engine, LookaheadEngine)
