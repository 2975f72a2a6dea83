"""Settings for every test: offline, and few threads on a shared 2-core machine."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch

torch.set_num_threads(2)
