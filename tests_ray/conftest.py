"""Set-up for the tests of the server under Ray Serve (``make test-ray``, not ``make test``).

A local Ray instance on this machine only: without `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` at 0 a
Linux Ray takes the machine's outward address as its node's (a cluster's default) and its
processes talk over it; at 0 they use 127.0.0.1, as Ray does on a laptop. No usage report is
sent. Both are read by Ray when it is imported, and inherited by the processes it starts.
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# As in each replica (Ray gives a 1-CPU actor one thread): the in-process answers are computed alike.
torch.set_num_threads(1)
