"""`python -m rag_lookahead` is the `rag-lookahead` command."""

import sys

from rag_lookahead.cli import main

sys.exit(main())
