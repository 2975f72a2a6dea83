import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny models gain nothing from threads, and spinning threads slow a loaded 2-core machine.
torch.set_num_threads(1)
