"""This package's README, and the LangChain blocks of the root README and docs/, run as written (on a tiny
random model in place of the built-in ones; `rag_lookahead.testing.readme`)."""

from pathlib import Path

from rag_lookahead.testing.readme import integration_tests

TestReadme = integration_tests(Path(__file__).resolve().parents[4], "langchain")
