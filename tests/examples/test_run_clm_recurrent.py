"""examples/language-modeling/run_clm_recurrent.py runs as a subprocess: plain, resumed, LoRA, accelerate, torchrun.

The runs convert a tiny GPT-2 saved in a temporary folder and train on a few standard library modules.
"""

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, TrainingArguments

from hf_recurrence import RecurrentGPT2LMHeadModel
from hf_recurrence.data import TokenBlocks, WindowedBlocksCollator, token_stream
from hf_recurrence.outputs import (
    MANIFEST_NAME,
    MODEL_FOLDER_FILES,
    TRAINING_RUN_FILES,
    OutputDirArguments,
    UsageError,
    finish_output_dir,
    prepare_training_output_dir,
)

from ..common import REPO_ROOT, SRC_ROOT, TINY_GPT2, stdlib_tokenizer


SCRIPT = REPO_ROOT / "examples" / "language-modeling" / "run_clm_recurrent.py"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TRAIN_FILES = [str(STDLIB / "bisect.py"), str(STDLIB / "heapq.py")]
VALIDATION_FILE = str(STDLIB / "abc.py")
BLOCK_SIZE = 2 + 3 * 6  # window_overlap + windows_per_block * stride


def load_script():
    spec = importlib.util.spec_from_file_location("run_clm_recurrent", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECURRENCE = {"window_size": 8, "window_overlap": 2, "insertion_layer": 1, "recurrence_hidden_sizes": [16, 16]}
CONVERT_ON_LOAD = ("--window_size", "8", "--window_overlap", "2", "--insertion_layer", "1", "--recurrence_hidden_sizes", "16", "16")  # fmt: skip
BASELINE = ("--model_type", "gpt2", "--window_size", "8", "--window_overlap", "2")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A tiny stock GPT-2 and its tokenizer, saved side by side as a Hub checkpoint would be."""
    path = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = stdlib_tokenizer()
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, "vocab_size": len(tokenizer)})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def recurrent_dir(gpt2_dir, tmp_path_factory) -> Path:
    """The tiny GPT-2 converted into a recurrent GPT-2 and saved with its tokenizer: the base for LoRA."""
    path = tmp_path_factory.mktemp("tiny-recurrent-gpt2")
    RecurrentGPT2LMHeadModel.from_pretrained(gpt2_dir, **RECURRENCE).save_pretrained(path)
    stdlib_tokenizer().save_pretrained(path)
    return path


def train_args(model_dir: Path, output_dir: Path, *extra: str, model: tuple[str, ...] = CONVERT_ON_LOAD) -> list[str]:
    return [
        *("--model_name_or_path", str(model_dir), "--output_dir", str(output_dir), *model, "--windows_per_block", "3"),
        *("--train_file", *TRAIN_FILES, "--max_train_samples", "32"),
        *("--do_train", "--per_device_train_batch_size", "2", "--learning_rate", "1e-3", "--logging_steps", "1"),
        *("--use_cpu", "--report_to", "none", "--disable_tqdm", "true", "--seed", "0"),
        *extra,
    ]


def run_example(args: list[str], launcher: tuple[str, ...] = (), timeout: int = 300) -> None:
    """Run the script in a fresh interpreter that imports this checkout's `hf_recurrence`."""
    result = run_process(args, launcher, timeout)
    assert result.returncode == 0, f"{' '.join(result.args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"


def run_process(args: list[str], launcher: tuple[str, ...] = (), timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC_ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, *launcher, str(SCRIPT), *args]
    return subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def logged_losses(output_dir: Path) -> dict[int, float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def eval_blocks(tokenizer, count: int) -> torch.Tensor:
    text = Path(VALIDATION_FILE).read_text(encoding="utf-8")
    return TokenBlocks(token_stream([text], tokenizer), BLOCK_SIZE).blocks[:count]


@pytest.fixture(scope="module")
def four_steps(gpt2_dir, tmp_path_factory) -> Path:
    """An uninterrupted 4-step run that saves a checkpoint every 2 steps."""
    output_dir = tmp_path_factory.mktemp("four-steps")
    run_example(train_args(gpt2_dir, output_dir, "--max_steps", "4", "--save_steps", "2"))
    return output_dir


def test_plain_run_trains_and_saves(four_steps, gpt2_dir):
    results = json.loads((four_steps / "all_results.json").read_text())
    assert math.isfinite(results["train_loss"]) and results["train_samples"] == 32
    assert sorted(logged_losses(four_steps)) == [1, 2, 3, 4]
    assert (four_steps / "checkpoint-2" / "optimizer.pt").exists()

    model = RecurrentGPT2LMHeadModel.from_pretrained(four_steps)
    assert (model.config.window_size, model.config.window_overlap, model.config.insertion_layer) == (8, 2, 1)
    stock = GPT2LMHeadModel.from_pretrained(gpt2_dir)
    assert not torch.equal(model.transformer.h[0].attn.c_attn.weight, stock.transformer.h[0].attn.c_attn.weight)


@pytest.mark.slow
def test_baseline_collator_cuts_blocks_into_the_recurrent_windows():
    collator = WindowedBlocksCollator(window_size=8, window_overlap=2)
    blocks = torch.arange(2 * BLOCK_SIZE).view(2, BLOCK_SIZE)
    batch = collator([{"input_ids": block, "labels": block} for block in blocks])
    assert batch["input_ids"].shape == (2 * 3, 8)
    torch.testing.assert_close(batch["input_ids"][1], torch.arange(6, 14))  # block 0, window 1: stride 6
    torch.testing.assert_close(batch["input_ids"][3], torch.arange(BLOCK_SIZE, BLOCK_SIZE + 8))  # block 1, window 0
    # The overlap is context only: every token of a block but its first is a label (predicted) exactly once.
    targets = batch["labels"][:, 1:]
    assert sorted(targets[targets != -100].tolist()) == [t for t in range(2 * BLOCK_SIZE) if t % BLOCK_SIZE]


@pytest.mark.slow
def test_baseline_trains_a_plain_gpt2(gpt2_dir, tmp_path):
    output_dir = tmp_path / "baseline"
    run_example(train_args(gpt2_dir, output_dir, "--max_steps", "2", "--save_strategy", "no", model=BASELINE))
    assert sorted(logged_losses(output_dir)) == [1, 2]
    assert type(AutoModelForCausalLM.from_pretrained(output_dir)) is GPT2LMHeadModel


def test_baseline_refuses_recurrence_settings(gpt2_dir):
    script = load_script()
    model_args = script.ModelArguments(model_name_or_path=str(gpt2_dir), model_type="gpt2", bptt_windows=2)
    with pytest.raises(ValueError, match="bptt_windows"):
        script.load_model(model_args)


@pytest.mark.slow
def test_resume_from_checkpoint_continues_the_run(four_steps, gpt2_dir, tmp_path):
    resumed = tmp_path / "resumed"
    run_example(
        train_args(
            gpt2_dir, resumed, "--max_steps", "4", "--save_steps", "2",
            "--resume_from_checkpoint", str(four_steps / "checkpoint-2"),
        )
    )  # fmt: skip
    assert sorted(logged_losses(resumed)) == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint's state
    for step in (3, 4):
        assert logged_losses(resumed)[step] == pytest.approx(logged_losses(four_steps)[step], rel=1e-5)
    expected, actual = load_file(four_steps / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], msg=name)


def test_a_used_output_folder_is_refused_before_training(gpt2_dir, tmp_path):
    (tmp_path / "checkpoint-30").mkdir()  # an earlier, longer run's: get_last_checkpoint would pick it
    result = run_process(train_args(gpt2_dir, tmp_path, "--max_steps", "2"))
    assert result.returncode != 0
    assert "is not empty" in result.stderr and "--overwrite_output_dir" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-30"]


def output_dir_arguments(output_dir: Path, **arguments) -> TrainingArguments:
    return TrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to="none", **arguments)


WRITER = "run_clm_recurrent.py"


def test_overwrite_output_dir_removes_the_earlier_run_only(tmp_path):
    owned, arguments = MODEL_FOLDER_FILES + TRAINING_RUN_FILES, output_dir_arguments(tmp_path)
    prepare_training_output_dir(arguments, owned, OutputDirArguments(), writer=WRITER)
    for name in ("checkpoint-30", "runs"):
        (tmp_path / name).mkdir()
    for name in ("model.safetensors", "trainer_state.json", "train_results.json"):
        (tmp_path / name).write_text("earlier")
    finish_output_dir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"no earlier run of run_clm_recurrent.py wrote there \(notes.txt\)"):
        prepare_training_output_dir(arguments, owned, OutputDirArguments(True), writer=WRITER)
    (tmp_path / "notes.txt").unlink()
    prepare_training_output_dir(arguments, owned, OutputDirArguments(True), writer=WRITER)
    assert [path.name for path in tmp_path.iterdir()] == [MANIFEST_NAME]


def test_resuming_continues_in_its_own_folder(tmp_path):
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    owned = MODEL_FOLDER_FILES + TRAINING_RUN_FILES
    resuming = output_dir_arguments(tmp_path, resume_from_checkpoint=str(checkpoint))
    prepare_training_output_dir(resuming, owned, OutputDirArguments(), writer=WRITER)
    with pytest.raises(UsageError, match="would remove --resume_from_checkpoint"):
        prepare_training_output_dir(resuming, owned, OutputDirArguments(overwrite_output_dir=True), writer=WRITER)
    assert checkpoint.is_dir()


# peft 0.21 still reads the `is_gradient_checkpointing` property that transformers 5.23 deprecates.
PEFT_READS_DEPRECATED_PROPERTY = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)


@PEFT_READS_DEPRECATED_PROPERTY
def test_lora_trains_only_adapters_and_recurrence(recurrent_dir):
    script = load_script()
    model_args = script.ModelArguments(model_name_or_path=str(recurrent_dir), use_lora=True)
    script.check_lora_base(model_args)
    model = script.add_lora(script.load_model(model_args), model_args)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert any(".recurrence." in name for name in trainable) and any("lora_" in name for name in trainable)
    for name in trainable:
        assert "lora_" in name or ".recurrence.modules_to_save." in name, name


@pytest.mark.parametrize(
    "model_dir, settings", [("gpt2_dir", {}), ("recurrent_dir", {"window_size": 4})], ids=["gpt2", "overridden"]
)
def test_lora_refuses_a_base_it_could_not_be_loaded_back_onto(request, model_dir, settings):
    script = load_script()
    model_args = script.ModelArguments(model_name_or_path=str(request.getfixturevalue(model_dir)), **settings)
    with pytest.raises(ValueError, match="convert"):
        script.check_lora_base(model_args)


@PEFT_READS_DEPRECATED_PROPERTY
def test_lora_adapter_round_trip(recurrent_dir, tmp_path):
    from peft import PeftModel

    output_dir = tmp_path / "lora"
    run_example(
        train_args(
            recurrent_dir, output_dir, "--use_lora", "--learning_rate", "1e-2", "--max_steps", "2",
            "--save_strategy", "no", "--do_eval", "--validation_file", VALIDATION_FILE, "--max_eval_samples", "4",
            "--per_device_eval_batch_size", "4",
            model=(),  # the window settings are the checkpoint's
        )
    )  # fmt: skip
    saved = load_file(output_dir / "adapter_model.safetensors")
    assert any(".recurrence." in name for name in saved) and any("lora_B" in name for name in saved)
    assert all("lora_" in name or ".recurrence." in name for name in saved)  # no backbone weight
    assert all(saved[name].abs().sum() > 0 for name in saved if "lora_B" in name)  # trained away from LoRA's zero init

    base = RecurrentGPT2LMHeadModel.from_pretrained(recurrent_dir)
    model = PeftModel.from_pretrained(base, output_dir).eval()
    ids = eval_blocks(stdlib_tokenizer(), 4)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    # The training process evaluated the same blocks in one batch after training: the reloaded model agrees.
    eval_loss = json.loads((output_dir / "eval_results.json").read_text())["eval_loss"]
    assert loss.item() == pytest.approx(eval_loss, abs=1e-5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ACCELERATE = ("-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1", "--num_machines", "1")
ACCELERATE_DEFAULTS = (
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
)  # stated, so accelerate needs no config file
TORCHRUN = ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port")


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher, extra, processes",
    [((*ACCELERATE, *ACCELERATE_DEFAULTS), (), 1), ((*TORCHRUN, "{port}"), ("--ddp_backend", "gloo"), 2)],
    ids=["accelerate", "torchrun-2-processes"],
)
def test_launchers(gpt2_dir, tmp_path, launcher, extra, processes):
    launcher = tuple(arg.format(port=free_port()) for arg in launcher)
    output_dir = tmp_path / "out"
    run_example(train_args(gpt2_dir, output_dir, "--max_steps", "2", "--save_strategy", "no", *extra), launcher)
    assert sorted(logged_losses(output_dir)) == [1, 2]
    # 2 steps of 2 blocks per process, out of 32 blocks: each process reads its own share.
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["epoch"] == pytest.approx(2 * 2 * processes / 32)
    assert RecurrentGPT2LMHeadModel.from_pretrained(output_dir).config.window_size == 8
