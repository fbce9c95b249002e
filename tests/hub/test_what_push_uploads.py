"""What `push_folder` (and `hf-recurrence push`) uploads from a training run's output folder: the model repo's
files only, never a pickle, a checkpoint or a log, and never the Hub token that `training_args.bin` holds."""

import logging
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, hf_hub_download

from hf_recurrence import RecurrentGPT2LMHeadModel
from hf_recurrence.cli import main

from ..common import stdlib_tokenizer, tiny_recurrent_config, user_error


SECRET = "hf_secret_token_from_training_args"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.fixture
def training_run(tmp_path) -> tuple[Path, set[str]]:
    """A folder as `run_clm_recurrent.py --hub_token ...` leaves it, and the names of its model repo files."""
    folder = tmp_path / "run"
    RecurrentGPT2LMHeadModel(tiny_recurrent_config()).save_pretrained(folder)
    stdlib_tokenizer().save_pretrained(folder)
    model_files = {path.name for path in folder.iterdir()}
    # Trainer's pickles hold arbitrary objects; training_args.bin holds --hub_token in clear.
    torch.save({"hub_token": SECRET}, folder / "training_args.bin")
    (folder / "trainer_state.json").write_text('{"global_step": 2}')
    (folder / "all_results.json").write_text('{"train_loss": 1.0}')
    checkpoint = folder / "checkpoint-2"
    checkpoint.mkdir()
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": name}, checkpoint / name)
    torch.save({"hub_token": SECRET}, checkpoint / "training_args.bin")
    (folder / "runs").mkdir()
    (folder / "runs" / "events.out.tfevents").write_bytes(b"log")
    return folder, model_files


def test_push_of_a_training_run_uploads_the_model_files_only(training_run, caplog, capsys):
    folder, model_files = training_run
    before = snapshot(folder)
    with caplog.at_level(logging.WARNING, logger="hf_recurrence.hub"):
        assert main(["push", str(folder), "alice/trained-run"]) == 0

    uploaded = set(HfApi().list_repo_files("alice/trained-run")) - {".gitattributes"}
    assert uploaded == {*model_files, "README.md"}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= uploaded
    for name in uploaded:
        assert SECRET.encode() not in Path(hf_hub_download("alice/trained-run", name)).read_bytes(), name

    (left_out,) = [record.getMessage() for record in caplog.records if "Not uploaded" in record.getMessage()]
    for entry in ("training_args.bin", "trainer_state.json", "all_results.json", "checkpoint-2/ (4 files)", "runs/"):
        assert entry in left_out
    assert snapshot(folder) == before


def test_a_folder_with_pickled_weights_only_is_refused(tmp_path, capsys):
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config())
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    error = user_error(capsys, ["push", str(tmp_path), "alice/pickled"])
    assert "pytorch_model.bin" in error and "save_pretrained" in error
    assert not HfApi().repo_exists("alice/pickled")


def test_no_hub_access_is_one_line(training_run, capsys, monkeypatch):
    from huggingface_hub import constants

    folder, _ = training_run
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "offline mode is enabled" in user_error(capsys, ["push", str(folder), "alice/offline"])


def test_an_unreachable_hub_or_a_bad_token_is_one_line(training_run, capsys, monkeypatch):
    from huggingface_hub import constants

    folder, _ = training_run
    assert "401 Unauthorized" in user_error(capsys, ["push", str(folder), "alice/denied", "--token", "hf_not_a_token"])
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert "cannot reach the Hub at http://127.0.0.1:9" in user_error(capsys, ["push", str(folder), "alice/x"])


def test_push_uploads_exactly_the_checkpoint_and_says_so_first(tmp_path, caplog, capsys):
    folder = tmp_path / "model"
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config())
    model.save_pretrained(folder)
    stdlib_tokenizer().save_pretrained(folder)
    checkpoint = {path.name for path in folder.iterdir()}
    # The model code imports a sibling file: it is part of the checkpoint too.
    modeling = folder / "modeling_recurrent_decoder.py"
    modeling.write_text(modeling.read_text() + "\nfrom .helpers_recurrent_decoder import HELPER  # noqa\n")
    (folder / "helpers_recurrent_decoder.py").write_text("HELPER = 1\n")
    (folder / "my_secrets.py").write_text(f"TOKEN = {SECRET!r}\n")
    (folder / "notes.txt").write_text("my notes")
    outside = tmp_path / "bashrc"
    outside.write_text(f"export HF_TOKEN={SECRET}\n")
    (folder / "tokenizer.model").symlink_to(outside)
    with torch.no_grad():
        model(torch.randint(0, 99, (1, 12))).past_key_values.save(folder / "state.safetensors")

    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="hf_recurrence.hub"):
        assert main(["push", str(folder), "alice/exact"]) == 0
    uploaded = set(HfApi().list_repo_files("alice/exact")) - {".gitattributes"}
    assert uploaded == {*checkpoint, "helpers_recurrent_decoder.py", "README.md"}
    for name in uploaded:
        assert SECRET.encode() not in Path(hf_hub_download("alice/exact", name)).read_bytes(), name
    printed = capsys.readouterr().out
    assert printed.index("Uploading from") < printed.index("Pushed")
    assert "helpers_recurrent_decoder.py" in printed and "README.md (the model card" in printed
    (left_out,) = [record.getMessage() for record in caplog.records if "Not uploaded" in record.getMessage()]
    assert "(a symlink pointing out of the folder): tokenizer.model" in left_out
    assert "(a saved recurrent state, which holds the text it read; --include its exact name): state.safetensors" in (
        left_out
    )
    assert "--include a pattern to add it): my_secrets.py, notes.txt" in left_out

    # --include adds files; a state file only by its exact name, and never the symlink out of the folder.
    assert main(["push", str(folder), "alice/included", "--include", "*.txt", "--include", "*.safetensors"]) == 0
    assert set(HfApi().list_repo_files("alice/included")) >= {"notes.txt"}
    assert not {"state.safetensors", "tokenizer.model"} & set(HfApi().list_repo_files("alice/included"))
    assert main(["push", str(folder), "alice/with-state", "--include", "state.safetensors"]) == 0
    assert "state.safetensors" in HfApi().list_repo_files("alice/with-state")


def test_a_symlink_loop_in_the_folder_is_left_out_by_name(tmp_path, caplog):
    folder = tmp_path / "model"
    RecurrentGPT2LMHeadModel(tiny_recurrent_config()).save_pretrained(folder)
    (folder / "a").symlink_to("b")
    (folder / "b").symlink_to("a")
    (folder / "itself").symlink_to("itself")
    with caplog.at_level(logging.WARNING, logger="hf_recurrence.hub"):
        assert main(["push", str(folder), "alice/looped"]) == 0
    (left_out,) = [record.getMessage() for record in caplog.records if "Not uploaded" in record.getMessage()]
    assert "(a symlink loop, which points at no file): a, b, itself" in left_out
    assert "model.safetensors" in HfApi().list_repo_files("alice/looped")
