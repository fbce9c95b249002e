"""The inductive-generalization example runs end to end with tiny models and reports every model and difficulty, with
the authors' protocol as options, and the driver's presets are the recorded CPU run, the larger CPU run whose
baselines learn, and the paper's recipe."""

import importlib.util
import json
import math
import sys

import pytest
import torch
from transformers import HfArgumentParser, TrainingArguments

from hf_recurrence import IBertForMaskedLM, InductiveBertConfig
from hf_recurrence.data import NumberSequenceDataset

from ..common import REPO_ROOT
from ..scripts import EXPERIMENTS, exit_of


SCRIPT = REPO_ROOT / "examples" / "inductive_generalization" / "run_inductive_generalization.py"
TINY = [
    "--hidden_size", "16", "--num_hidden_layers", "1", "--num_attention_heads", "2", "--intermediate_size", "32",
    "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true", "--disable_tqdm", "true",
]  # fmt: skip


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """The models are tiny: every test here runs on one thread (the shared `one_thread` fixture)."""


@pytest.fixture(scope="module")
def script():
    return load(SCRIPT, "run_inductive_generalization")


@pytest.fixture
def driver(monkeypatch):
    """experiments/inductive_generalization.py as a module (its `import _common` resolves as when it is run)."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    for name in ("_common", "render"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return load(EXPERIMENTS / "inductive_generalization.py", "inductive_generalization_driver")


def test_run_inductive_generalization(tmp_path, script):
    argv = [
        "--output_dir", str(tmp_path), "--models", "ibert,bert,ibert_pe,ibert2", "--task", "add",
        "--train_difficulties", "2-4", "--validation_difficulties", "5-6",
        "--train_examples_per_difficulty", "4", "--validation_examples_per_difficulty", "2",
        "--max_steps", "2", "--per_device_train_batch_size", "4", *TINY,
    ]  # fmt: skip
    script.main(argv)

    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["results"]) == {"ibert", "bert", "ibert_pe", "ibert2"}
    assert report["protocol"] == {
        "regenerate_every_epoch": False,
        "random_offset_layout": False,
        "loss_on_every_position": False,
        "lr_decay_per_epoch": None,
    }
    for result in report["results"].values():
        assert set(result["sequence_accuracy"]) == {"2", "3", "4", "5", "6"}  # JSON keys are strings
        assert all(0.0 <= accuracy <= 1.0 for accuracy in result["sequence_accuracy"].values())
        assert set(result["digit_loss"]) == {"train", "validation"}
        # No evaluation during training: the only one is the final checkpoint's, which is also the one chosen.
        assert [evaluation["step"] for evaluation in result["evaluations"]] == [result["final_step"]] == [2]
        assert result["chosen_on_validation_loss"] == result["evaluations"][0]
        assert result["chosen_on_validation_loss"]["sequence_accuracy"] == result["sequence_accuracy"]
    assert (tmp_path / "accuracy_vs_difficulty.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_authors_protocol_runs_and_reports_final_and_chosen_checkpoints(tmp_path, script, capsys, monkeypatch):
    made = []

    def inductive_split(*args, **kwargs):
        made.extend(script_split(*args, **kwargs))
        return made[-2:]

    script_split = script.inductive_split
    monkeypatch.setattr(script, "inductive_split", inductive_split)
    argv = [
        "--output_dir", str(tmp_path), "--models", "ibert,bert", "--task", "copy",
        "--train_difficulties", "1-3", "--validation_difficulties", "4-5",
        "--train_examples_per_difficulty", "8", "--validation_examples_per_difficulty", "4",
        "--regenerate_every_epoch", "true", "--random_offset_layout", "true", "--loss_on_every_position", "true",
        "--lr_decay_per_epoch", "0.5", "--learning_rate", "3e-3", "--eval_strategy", "epoch",
        "--num_train_epochs", "3", "--per_device_train_batch_size", "8", *TINY,
    ]  # fmt: skip
    report = script.main(argv)

    assert report["protocol"]["random_offset_layout"] and report["data_arguments"]["train_difficulties"] == "1-3"
    assert report["train_difficulties"] == [1, 2, 3]
    for result in report["results"].values():
        assert set(result["sequence_accuracy"]) == {1, 2, 3, 4, 5}
        assert "digit_loss" not in result and set(result["position_loss"]) == {"train", "validation"}
        # 24 sequences a batch of 8: 3 steps an epoch; an evaluation after each epoch, the last one being the final.
        history = result["evaluations"]
        assert [evaluation["step"] for evaluation in history] == [3, 6, 9] and result["final_step"] == 9
        assert history[-1]["sequence_accuracy"] == result["sequence_accuracy"]
        assert history[-1]["position_loss"] == result["position_loss"]
        lowest = min(evaluation["position_loss"]["validation"] for evaluation in history)
        assert result["chosen_on_validation_loss"]["position_loss"]["validation"] == lowest
        assert result["chosen_on_validation_loss"] in history
    # The options reach the data: windows of the longest copy of d = 3 and of d = 5, every position labelled, and a
    # training set that was drawn afresh up to the third epoch.
    train_set, validation_set = made
    assert (train_set.width, validation_set.width) == (9, 13)
    assert train_set.label_every_position and validation_set.label_every_position
    assert train_set.epoch == 2 and not validation_set.regenerate_every_epoch
    assert "Final checkpoints:" in capsys.readouterr().out


def test_choosing_on_validation_loss_and_labelling_the_choice(script, capsys, tmp_path):
    log_history = [
        {"loss": 2.0, "step": 5, "epoch": 1.0},
        {"eval_train_loss": 1.0, "eval_train_sequence_accuracy_d2": 0.5, "step": 5, "epoch": 1.0},
        {"eval_validation_loss": 3.0, "eval_validation_sequence_accuracy_d9": 0.1, "step": 5, "epoch": 1.0},
        {"eval_train_loss": 0.5, "eval_train_sequence_accuracy_d2": 0.9, "step": 10, "epoch": 2.0},
        {"eval_validation_loss": 2.0, "eval_validation_sequence_accuracy_d9": 0.4, "step": 10, "epoch": 2.0},
        {"eval_train_loss": 0.2, "eval_train_sequence_accuracy_d2": 1.0, "step": 15, "epoch": 3.0},
        {"eval_validation_loss": 2.5, "eval_validation_sequence_accuracy_d9": 0.3, "step": 15, "epoch": 3.0},
        {"train_runtime": 1.0, "step": 15, "epoch": 3.0},
    ]
    history = script.evaluation_history(log_history, "digit_loss")
    assert history[1] == {
        "step": 10,
        "epoch": 2.0,
        "digit_loss": {"train": 0.5, "validation": 2.0},
        "sequence_accuracy": {2: 0.9, 9: 0.4},
    }
    assert [evaluation["step"] for evaluation in history] == [5, 10, 15]
    chosen = min(history, key=lambda evaluation: evaluation["digit_loss"]["validation"])
    results = {
        "ibert": {
            "label": "I-BERT",
            "parameters": 1000,
            "sequence_accuracy": history[-1]["sequence_accuracy"],
            "final_step": 15,
            "chosen_on_validation_loss": chosen,
        }
    }
    script.print_table(results, range(2, 3), range(9, 10))
    script.print_table(results, range(2, 3), range(9, 10), checkpoint="chosen")
    out = capsys.readouterr().out
    assert "| I-BERT | 1,000 | 1.000 | 0.300 |" in out and "| I-BERT, step 10 | 1,000 | 0.900 | 0.400 |" in out
    script.plot(results, "add", range(2, 3), tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_epoch_decay_multiplies_the_learning_rate_once_per_epoch(tmp_path, script):
    config = InductiveBertConfig(
        vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, pad_token_id=0
    )
    # 10 sequences in batches of 4: 3 steps an epoch.
    arguments = TrainingArguments(tmp_path, learning_rate=1.0, per_device_train_batch_size=4, use_cpu=True)
    trainer = script.EpochDecayTrainer(
        model=IBertForMaskedLM(config),
        args=arguments,
        train_dataset=NumberSequenceDataset("copy", [2], 10),
        lr_decay_per_epoch=0.5,
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=9)
    rates = []
    for _ in range(9):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert rates == [1.0] * 3 + [0.5] * 3 + [0.25] * 3
    with pytest.raises(ValueError, match="warm-up"):
        script.EpochDecayTrainer(
            model=IBertForMaskedLM(config),
            args=TrainingArguments(tmp_path, warmup_steps=10, use_cpu=True),
            lr_decay_per_epoch=0.97,
        )


def test_the_paper_gpu_preset_is_the_papers_model_and_40000_steps(driver, script):
    flags = driver.example_flags("paper-gpu", authors_protocol=False)
    parser = HfArgumentParser(
        (script.ModelArguments, script.DataArguments, script.ProtocolArguments, TrainingArguments)
    )
    model_args, data_args, protocol, training_args = parser.parse_args_into_dataclasses([*flags, "--output_dir", "x"])
    with torch.device("meta"):
        model = script.build_model("ibert", model_args, max_length=53)
    assert round(model.num_parameters() / 1e6, 1) == 70.3
    assert (model_args.num_hidden_layers, model_args.hidden_size, model_args.intermediate_size) == (12, 768, 2048)
    sequences = len(script.parse_range(data_args.train_difficulties)) * data_args.train_examples_per_difficulty
    steps = math.ceil(sequences / training_args.per_device_train_batch_size) * training_args.num_train_epochs
    assert steps == 40_000
    assert (training_args.learning_rate, protocol.lr_decay_per_epoch, training_args.max_grad_norm) == (3e-5, 0.97, 1.0)
    assert training_args.eval_strategy == "epoch"
    # The authors' protocol keeps 800 steps an epoch with difficulties 1..12.
    _, data_args, protocol, training_args = parser.parse_args_into_dataclasses(
        [*driver.example_flags("paper-gpu", authors_protocol=True), "--output_dir", "x"]
    )
    sequences = len(script.parse_range(data_args.train_difficulties)) * data_args.train_examples_per_difficulty
    assert script.parse_range(data_args.train_difficulties) == range(1, 13)
    assert math.ceil(sequences / 32) * training_args.num_train_epochs == 40_000
    assert protocol.regenerate_every_epoch and protocol.random_offset_layout and protocol.loss_on_every_position
    # The default preset is the recorded CPU run, unchanged.
    assert driver.example_flags("cpu", authors_protocol=False) == driver.CPU_RUN


def test_the_cpu_learning_preset_is_wider_deeper_without_dropout_and_evaluates_during_training(driver, script):
    parser = HfArgumentParser(
        (script.ModelArguments, script.DataArguments, script.ProtocolArguments, TrainingArguments)
    )
    flags = driver.example_flags("cpu-learning", authors_protocol=False)
    model_args, data_args, _, training_args = parser.parse_args_into_dataclasses([*flags, "--output_dir", "x"])
    sizes = (model_args.hidden_size, model_args.num_hidden_layers, model_args.num_attention_heads)
    assert sizes == (128, 4, 4) and model_args.intermediate_size == 512 and model_args.dropout == 0.0
    assert model_args.models == "ibert,bert,ibert_pe" and data_args.task == "add"
    assert (training_args.max_steps, training_args.learning_rate, training_args.warmup_steps) == (8000, 1e-3, 200)
    assert training_args.eval_strategy == "steps" and training_args.eval_steps == 1000
    # The same data as the recorded run: the paper's split, not sparse predictions.
    _, recorded_data, _, _ = parser.parse_args_into_dataclasses([*driver.CPU_RUN, "--output_dir", "x"])
    assert data_args == recorded_data
    # The dropout flag reaches every model's config (BERT's and I-BERT's fields of the same names).
    with torch.device("meta"):
        for name in ("ibert", "bert", "ibert_pe"):
            config = script.build_model(name, model_args, max_length=53).config
            assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (0.0, 0.0)
    # Without the flag, BERT's 0.1 as before.
    model_args, *_ = parser.parse_args_into_dataclasses([*driver.CPU_RUN, "--output_dir", "x"])
    assert model_args.dropout == 0.1


def test_the_cpu_learning_preset_records_apart(driver, tmp_path):
    default = driver.bench.REPO_ROOT / "experiments" / "results" / "inductive_generalization.json"
    args = driver.argparse.Namespace(output_json=default)
    assert driver.record_paths(args, "cpu") == driver.IMAGE and args.output_json == default
    image = driver.record_paths(args, "cpu-learning")
    assert args.output_json.name == "inductive_generalization_add_learning.json"
    assert image.name == "inductive_generalization_add_learning.png"
    # An explicit --output-json stays, and its plot is named after it: no recorded plot is overwritten.
    for preset in ("cpu", "cpu-learning"):
        args = driver.argparse.Namespace(output_json=tmp_path / "run.json")
        image = driver.record_paths(args, preset)
        assert args.output_json == tmp_path / "run.json"
        assert image == driver.bench.REPO_ROOT / "docs" / "images" / "run.png"


def test_the_driver_curve_table_gives_accuracy_against_steps(driver):
    def evaluation(step, seen, unseen):
        return {"step": step, "sequence_accuracy": {"2": seen, "3": seen, "13": unseen, "14": 0.0}}

    report = {"task": "add", "train_difficulties": [2, 3], "validation_difficulties": [13, 14]}
    report["results"] = {
        "ibert": {"label": "I-BERT", "evaluations": [evaluation(1000, 0.5, 0.25), evaluation(2000, 1.0, 0.5)]},
        "bert": {"label": "BERT", "evaluations": [evaluation(1000, 0.25, 0.0)]},
    }
    table = driver.curve_table(report)
    assert table["headers"] == ["step", "I-BERT, d 2..3", "I-BERT, d=13", "BERT, d 2..3", "BERT, d=13"]
    assert table["rows"] == [["1,000", "0.500", "0.250", "0.250", "0.000"], ["2,000", "1.000", "0.500", "", ""]]
    # Only the final evaluation: no curve.
    for result in report["results"].values():
        result["evaluations"] = result["evaluations"][:1]
    assert driver.curve_table(report) is None


def test_the_driver_table_labels_final_and_chosen_checkpoints(driver):
    def result(label, final, chosen_step, chosen):
        evaluation = {"step": chosen_step, "sequence_accuracy": {str(d): chosen for d in (2, 3, 13)}}
        return {
            "label": label,
            "parameters": 1234,
            "train_runtime_s": 60.0,
            "final_step": 100,
            "sequence_accuracy": {str(d): final for d in (2, 3, 13)},
            "chosen_on_validation_loss": evaluation,
        }

    report = {"task": "add", "train_difficulties": [2, 3], "validation_difficulties": [13], "results": {}}
    report["results"] = {"ibert": result("I-BERT", 0.5, 40, 0.75), "bert": result("BERT", 0.25, 100, 0.25)}
    rows = driver.results_table(report)["rows"]
    assert [row[0] for row in rows] == [
        "I-BERT, final (step 100)",
        "BERT, final (step 100)",
        "I-BERT, lowest validation loss (step 40; inflated on d > 3)",
        "BERT, lowest validation loss (step 100; inflated on d > 3)",
        "I-BERT, paper (BERT-base, 50 epochs)",
        "I-BERT, authors' logs (their code, 50 epochs)",
    ]
    assert rows[0][3:] == ["0.500", "0.500"] and rows[2][3:] == ["0.750", "0.750"]
    assert rows[-1][3:] == ["about 1", "0.969"]
    # A report without evaluations during training (the recorded runs) keeps its rows as they were.
    for model in report["results"].values():
        del model["chosen_on_validation_loss"], model["final_step"]
    rows = driver.results_table(report)["rows"]
    assert [row[0] for row in rows[:2]] == ["I-BERT", "BERT"] and len(rows) == 4
    assert rows[0] == ["I-BERT", "1,234", "1.0", "0.500", "0.500"]


def test_the_driver_refuses_the_paper_gpu_preset_on_a_cpu(tmp_path, monkeypatch):
    arguments = ("--preset", "paper-gpu", "--device", "cpu", "--output-json", str(tmp_path / "run.json"))
    refusal = exit_of(EXPERIMENTS / "inductive_generalization.py", *arguments, monkeypatch=monkeypatch).code
    assert refusal == "--preset paper-gpu: a GPU job (40,000 steps of a 70.3M-parameter model), not for cpu"
    assert not (tmp_path / "run.json").exists()
