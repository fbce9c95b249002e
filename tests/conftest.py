"""Test session set-up: a Hub on loopback, private HF cache, deterministic, two threads (one per worker under `-n 2`).

Nothing in a test session may reach the real Hugging Face Hub. `HF_HUB_OFFLINE` cannot be the guard: huggingface_hub
reads it once, at import, into a process-wide constant, so it could not be lifted for the tests that push and pull
without patching module constants of two libraries. Instead the whole session points `HF_ENDPOINT` at the project's own
Hub-API server (tests/hub/server.py) on 127.0.0.1, started here before anything imports huggingface_hub or
transformers (both read the endpoint at import time), and checks that the clients took it. A test that touches the Hub
by accident gets a fast "not found" from loopback, never a network call.

`HF_TOKEN` is the token of the user "alice"; `BOB_TOKEN` is a second user's, for access checks.
"""

import os
import tempfile
from urllib.parse import urlsplit

import pytest
import torch

from .hub.server import HubServer


ALICE_TOKEN = "hf_test_token_alice"
BOB_TOKEN = "hf_test_token_bob"
HUB_SERVER = pytest.StashKey[HubServer]()


def pytest_configure(config):
    hub = HubServer({ALICE_TOKEN: "alice", BOB_TOKEN: "bob"}).start()
    config.stash[HUB_SERVER] = hub
    os.environ.pop("HF_HUB_OFFLINE", None)
    os.environ["HF_ENDPOINT"] = hub.url
    os.environ["HF_TOKEN"] = ALICE_TOKEN
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if "HF_HOME" not in os.environ or os.environ.get("PYTEST_XDIST_WORKER"):
        # Each pytest-xdist worker runs its own Hub server: its cache must not hold another worker's downloads.
        os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hf_recurrence_test_home_")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from huggingface_hub import constants

    assert urlsplit(constants.ENDPOINT).hostname == "127.0.0.1", (
        f"huggingface_hub was imported before the test Hub started: its endpoint is {constants.ENDPOINT}"
    )

    import torch

    # Two threads in all: the machines that run the suite have 2 cores, shared among pytest-xdist's workers.
    torch.set_num_threads(max(1, 2 // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def pytest_unconfigure(config):
    hub = config.stash.get(HUB_SERVER, None)
    if hub is not None:
        hub.stop()


def pytest_runtest_setup(item):
    import torch

    torch.manual_seed(0)


@pytest.fixture(scope="session")
def hub_server(pytestconfig) -> HubServer:
    """The session's Hub-API server; `HF_ENDPOINT` points at it."""
    return pytestconfig.stash[HUB_SERVER]


@pytest.fixture
def gpt2_dir(tmp_path):
    """A tiny stock GPT-2 folder with the stdlib tokenizer (`tests/common.py`), as `hf-recurrence convert` reads one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from .common import TINY_GPT2, stdlib_tokenizer

    path = tmp_path / "gpt2"
    tokenizer = stdlib_tokenizer()
    GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, "vocab_size": len(tokenizer)})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def one_thread():
    """Torch on one intra-op thread for the test: its matrices are tiny, and on 2 busy cores 2 threads are several
    times slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
