"""The inductive-generalization example runs end to end with tiny models and reports every model and difficulty."""

import importlib.util
import json

from ..common import REPO_ROOT


SCRIPT = REPO_ROOT / "examples" / "inductive_generalization" / "run_inductive_generalization.py"


def test_run_inductive_generalization(tmp_path):
    spec = importlib.util.spec_from_file_location("run_inductive_generalization", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = [
        "--output_dir", str(tmp_path), "--models", "ibert,bert,ibert_pe,ibert2", "--task", "add",
        "--train_difficulties", "2-4", "--validation_difficulties", "5-6",
        "--train_examples_per_difficulty", "4", "--validation_examples_per_difficulty", "2",
        "--hidden_size", "16", "--num_hidden_layers", "1", "--num_attention_heads", "2", "--intermediate_size", "32",
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
        "--use_cpu", "true", "--disable_tqdm", "true",
    ]  # fmt: skip
    script.main(argv)

    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["results"]) == {"ibert", "bert", "ibert_pe", "ibert2"}
    for result in report["results"].values():
        assert set(result["sequence_accuracy"]) == {"2", "3", "4", "5", "6"}  # JSON keys are strings
        assert all(0.0 <= accuracy <= 1.0 for accuracy in result["sequence_accuracy"].values())
        assert set(result["digit_loss"]) == {"train", "validation"}
    assert (tmp_path / "accuracy_vs_difficulty.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
