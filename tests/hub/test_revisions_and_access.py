"""Revision pinning and the errors a user sees for a missing repo, a missing revision and a private repo."""

import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import RepositoryNotFoundError
from transformers import AutoModelForCausalLM

from hf_recurrence import RecurrentGPT2LMHeadModel
from hf_recurrence.hub import push_to_hub

from ..common import ACROSS_KERNELS, tiny_recurrent_config
from ..conftest import BOB_TOKEN


NOT_FOUND = "is not a local folder and is not a valid model identifier"
PRIVATE_HINT = "If this is a private repository, make sure to pass a token"


def tiny_model() -> RecurrentGPT2LMHeadModel:
    return RecurrentGPT2LMHeadModel(tiny_recurrent_config()).eval()


def assert_same_weights(repo_id: str, expected: RecurrentGPT2LMHeadModel, **kwargs) -> None:
    loaded = AutoModelForCausalLM.from_pretrained(repo_id, **kwargs).eval()
    ids = torch.randint(1, 99, (1, 20))
    torch.testing.assert_close(loaded(ids).logits, expected(ids).logits, **ACROSS_KERNELS)


def test_an_older_revision_loads_the_older_weights_after_a_second_push():
    first, second, experiment = tiny_model(), tiny_model(), tiny_model()
    repo_id = "alice/revisions"
    first_commit = push_to_hub(first, repo_id)
    second_commit = push_to_hub(second, repo_id)
    push_to_hub(experiment, repo_id, revision="experiment")
    assert first_commit.oid != second_commit.oid

    assert_same_weights(repo_id, first, revision=first_commit.oid)
    assert_same_weights(repo_id, second)
    assert_same_weights(repo_id, second, revision=second_commit.oid)
    assert_same_weights(repo_id, experiment, revision="experiment")
    with pytest.raises(AssertionError):
        assert_same_weights(repo_id, second, revision=first_commit.oid)


@pytest.fixture(scope="module")
def private_repo() -> str:
    repo_id = "alice/private-recurrent-gpt2"
    push_to_hub(tiny_model(), repo_id, private=True)
    return repo_id


@pytest.mark.parametrize("token", [BOB_TOKEN, False], ids=["other-user", "anonymous"])
def test_a_private_repo_refuses_other_users_with_a_clear_error(private_repo, token):
    with pytest.raises(OSError, match=PRIVATE_HINT):
        AutoModelForCausalLM.from_pretrained(private_repo, token=token)
    with pytest.raises(RepositoryNotFoundError, match="make sure you are authenticated"):
        HfApi(token=token).model_info(private_repo)


def test_the_owner_loads_a_private_repo(private_repo):
    model = AutoModelForCausalLM.from_pretrained(private_repo)
    assert isinstance(model, RecurrentGPT2LMHeadModel)


def test_a_wrong_repo_name_is_a_clear_not_found_error():
    with pytest.raises(OSError, match=f"alice/no-such-repo {NOT_FOUND}"):
        AutoModelForCausalLM.from_pretrained("alice/no-such-repo", trust_remote_code=True)


def test_a_missing_revision_is_a_clear_error(private_repo):
    with pytest.raises(OSError, match="no-such-branch is not a valid git identifier"):
        AutoModelForCausalLM.from_pretrained(private_repo, revision="no-such-branch")
