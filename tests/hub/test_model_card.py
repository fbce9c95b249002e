"""Model cards, what a push uploads, plain `model.push_to_hub`, and `hf-recurrence push` on a saved folder."""

import json
import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import EvalResult, HfApi, ModelCard, hf_hub_download
from huggingface_hub.errors import RepositoryNotFoundError
from transformers import AutoModelForCausalLM, PreTrainedConfig

from hf_recurrence import RecurrentGPT2LMHeadModel
from hf_recurrence.cli import main
from hf_recurrence.hub import FAMILIES, model_card, push_to_hub, write_model_card
from hf_recurrence.models.recurrent_decoder.configuration_recurrent_decoder import GPT2_AUTO_MAP as AUTO_MAP

from ..common import ACROSS_KERNELS, REPO_ROOT, stdlib_tokenizer, tiny_recurrent_config, user_error
from ..conftest import BOB_TOKEN
from ..families import HUB_ROWS


PERPLEXITY = EvalResult(
    task_type="text-generation",
    dataset_type="python-stdlib",
    dataset_name="Python standard library sources",
    metric_type="perplexity",
    metric_value=123.4,
)


def assert_card_metadata(card: ModelCard, config: PreTrainedConfig, base_model: str | None) -> None:
    family = FAMILIES[config.model_type]
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == family.pipeline_tag
    assert {"hf-recurrence", config.model_type, f"arxiv:{family.paper.arxiv}"} <= set(card.data.tags)
    assert card.data.base_model == base_model
    assert (card.data.get("recurrence_settings") or {}) == {
        name: getattr(config, name) for name in config.family_settings
    }
    assert "trust_remote_code=True" in card.text
    assert "trust_remote_code=False)` loads it without asking" in card.text
    assert family.paper.title in card.text


@pytest.mark.parametrize("family", HUB_ROWS, ids=lambda family: family.model_type)
def test_every_family_has_a_card(family):
    model, _ = family.hub.make()
    card = model_card(model, f"alice/{family.model_type}")
    assert_card_metadata(ModelCard(str(card)), model.config, base_model=None)


@pytest.fixture(scope="module")
def pushed_with_card():
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=2, bptt_windows=3)).eval()
    tokenizer = stdlib_tokenizer()
    repo_id = "alice/card-recurrent-gpt2"
    commit = push_to_hub(
        model,
        repo_id,
        tokenizer=tokenizer,
        base_model="openai-community/gpt2",
        eval_results=[PERPLEXITY],
        commit_message="First upload",
    )
    return model, repo_id, commit


def test_push_uploads_everything_in_one_commit(pushed_with_card, hub_server):
    _, repo_id, commit = pushed_with_card
    files = set(HfApi().list_repo_files(repo_id))
    assert {
        "README.md",
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "configuration_recurrent_decoder.py",
        "modeling_recurrent_decoder.py",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= files
    config = json.loads(Path(hf_hub_download(repo_id, "config.json")).read_text())
    assert config["auto_map"] == AUTO_MAP
    # The repo's creation commit and the push.
    assert len(hub_server.repos[repo_id].commits) == 2
    assert commit.oid == HfApi().model_info(repo_id).sha


def test_the_card_has_the_metadata(pushed_with_card):
    model, repo_id, _ = pushed_with_card
    card = ModelCard.load(repo_id)
    assert_card_metadata(card, model.config, base_model="openai-community/gpt2")
    assert card.data.recurrence_settings["window_overlap"] == 2
    assert card.data.recurrence_settings["bptt_windows"] == 3
    assert card.data.eval_results == [PERPLEXITY]
    assert "| Python standard library sources | perplexity | 123.4 |" in card.text
    assert "@article{yoshida2020," in card.text


def test_base_model_defaults_to_the_hub_checkpoint_the_model_was_loaded_from(pushed_with_card, tmp_path):
    _, repo_id, _ = pushed_with_card
    loaded = AutoModelForCausalLM.from_pretrained(repo_id)
    assert model_card(loaded, "alice/fine-tuned").data.base_model == repo_id
    assert model_card(loaded, repo_id).data.base_model is None
    loaded.save_pretrained(tmp_path)
    from_folder = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model_card(from_folder, "alice/fine-tuned").data.base_model is None


def test_a_model_type_without_card_facts_is_refused():
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        model_card(PreTrainedConfig.from_dict({"model_type": "gpt2"}), "alice/x")


def test_plain_model_push_to_hub_gives_a_loadable_repo():
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config()).eval()
    model.push_to_hub("alice/plain-push")
    config = json.loads(Path(hf_hub_download("alice/plain-push", "config.json")).read_text())
    assert config["auto_map"] == AUTO_MAP
    loaded = AutoModelForCausalLM.from_pretrained("alice/plain-push").eval()
    ids = torch.randint(1, 99, (1, 20))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, **ACROSS_KERNELS)


def test_write_model_card_into_a_saved_folder(tmp_path):
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config())
    model.save_pretrained(tmp_path)
    path = write_model_card(tmp_path, "alice/saved", base_model="openai-community/gpt2")
    assert path == tmp_path / "README.md"
    assert_card_metadata(ModelCard.load(path), model.config, base_model="openai-community/gpt2")


def test_cli_push_of_a_saved_folder(tmp_path, capsys):
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config()).eval()
    model.save_pretrained(tmp_path)
    stdlib_tokenizer().save_pretrained(tmp_path)
    before = sorted(path.name for path in tmp_path.iterdir())
    repo_id = "alice/cli-pushed"
    argv = ["push", str(tmp_path), repo_id, "--revision", "v1", "--private", "--commit_message", "From the CLI"]
    assert main(argv) == 0
    assert f"to {repo_id} at commit" in capsys.readouterr().out

    # The folder is left as it was; the card is added to the commit only.
    assert sorted(path.name for path in tmp_path.iterdir()) == before
    assert {*before, "README.md"} <= set(HfApi().list_repo_files(repo_id, revision="v1"))
    card = ModelCard.load(hf_hub_download(repo_id, "README.md", revision="v1"))
    assert_card_metadata(card, model.config, base_model=None)
    loaded = AutoModelForCausalLM.from_pretrained(repo_id, revision="v1").eval()
    ids = torch.randint(1, 99, (1, 20))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, **ACROSS_KERNELS)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(token=BOB_TOKEN).model_info(repo_id)


def test_cli_push_keeps_the_folders_own_card(tmp_path):
    RecurrentGPT2LMHeadModel(tiny_recurrent_config()).save_pretrained(tmp_path)
    (tmp_path / "README.md").write_text("---\nlicense: mit\n---\n# My own card\n")
    assert main(["push", str(tmp_path), "alice/own-card"]) == 0
    assert ModelCard.load("alice/own-card").text.strip() == "# My own card"


def test_cli_push_refuses_a_folder_without_a_config(tmp_path, capsys):
    assert "has no config.json" in user_error(capsys, ["push", str(tmp_path), "alice/empty"])


def test_the_card_example_in_the_sharing_guide_is_what_model_card_writes():
    guide = (REPO_ROOT / "docs" / "guides" / "sharing.md").read_text()
    example = re.search(r"````markdown\n(.*?)````", guide, re.DOTALL).group(1)
    config = tiny_recurrent_config(
        n_positions=32, window_size=16, window_overlap=4, insertion_layer=1, recurrence_hidden_sizes=[32]
    )
    card = model_card(
        config, "alice/sharing-guide-recurrent-gpt2", base_model="openai-community/gpt2", eval_results=[PERPLEXITY]
    )
    assert ModelCard(example).data.to_dict() == card.data.to_dict()
    overview = card.text.split("## Recurrence settings")[0].split()
    assert example.split("## Recurrence settings")[0].split()[-len(overview) :] == overview
