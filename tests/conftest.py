"""Test session set-up: offline, private HF cache, deterministic, two threads.

The environment is set in `pytest_configure`, before any test module imports `huggingface_hub` or `transformers`, which
read it at import time.
"""

import os
import tempfile


def pytest_configure(config):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_recurrence_test_home_"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    torch.set_num_threads(2)


def pytest_runtest_setup(item):
    import torch

    torch.manual_seed(0)
