"""windowed_perplexity against the definition (stock GPT-2 / Llama) and against the model's own loss (recurrent
GPT-2 / Llama, Transformer-XL)."""

import math

import evaluate
import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from hf_recurrence import RecurrentGPT2LMHeadModel, RecurrentLlamaForCausalLM, TransformerXLLMHeadModel
from hf_recurrence.evaluation import METRIC_PATH, flops_per_token, perplexity, window_schedule, windowed_perplexity

from ..common import (
    TINY_GPT2,
    TINY_LLAMA,
    tiny_recurrent_config,
    tiny_recurrent_llama_config,
    tiny_transformer_xl_config,
)


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()


def recurrent_model(**overrides) -> RecurrentGPT2LMHeadModel:
    torch.manual_seed(0)
    return RecurrentGPT2LMHeadModel(tiny_recurrent_config(**overrides)).eval()


def reference_nll(model, ids: torch.Tensor, window: int, overlap: int) -> tuple[float, int]:
    """The definition, one window at a time: windows start every window - overlap tokens; each position predicts the
    next token from the first window that contains it; the last position predicts nothing."""
    total, count, next_position, start = 0.0, 0, 0, 0
    while next_position < len(ids) - 1:
        with torch.no_grad():
            log_probs = torch.log_softmax(model(ids[None, start : start + window]).logits[0].float(), dim=-1)
        for position in range(start, min(start + window, len(ids) - 1)):
            if position >= next_position:
                total -= log_probs[position - start, ids[position + 1]].item()
                count += 1
                next_position = position + 1
        start += window - overlap
    return total, count


def test_schedule_is_the_papers_example():
    # Paper §4.2, T=10, overlap 3: windows t1:10, t8:17, t15:24 predict t2:11, t12:18, t19:25 (1-based tokens).
    assert window_schedule(24, 10, 3) == [(0, 10, 0), (7, 17, 10), (14, 24, 17)]


@pytest.mark.parametrize(("window", "overlap"), [(16, 0), (16, 5), (16, 15), (7, 3), (8, 7), (1, 0)])
def test_stock_model_equals_reference_loop(gpt2, window, overlap):
    documents = [torch.randint(0, 99, (length,)) for length in (61, 17, 2, 9)]
    result = windowed_perplexity(gpt2, documents, window, overlap, batch_size=3, show_progress=False)

    expected = [reference_nll(gpt2, doc, window, overlap) for doc in documents]
    total, count = sum(t for t, _ in expected), sum(c for _, c in expected)
    assert count == sum(len(doc) - 1 for doc in documents)
    assert result.num_tokens == count and result.num_documents == 4
    assert (result.window_size, result.overlap) == (window, overlap)
    assert result.nll == pytest.approx(total / count, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(total / count), rel=1e-5)


class FullLogitsGPT2(GPT2LMHeadModel):
    """A causal LM whose forward has no `logits_to_keep`: the evaluation slices the new positions itself."""

    def forward(self, input_ids, attention_mask=None, use_cache=None):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)


def test_model_without_logits_to_keep_equals_reference_loop(gpt2):
    model = FullLogitsGPT2(gpt2.config).eval()
    model.load_state_dict(gpt2.state_dict())
    documents = [torch.randint(0, 99, (length,)) for length in (45, 9)]
    result = windowed_perplexity(model, documents, 16, 5, show_progress=False)
    expected = [reference_nll(gpt2, doc, 16, 5) for doc in documents]
    assert result.nll == pytest.approx(sum(t for t, _ in expected) / sum(c for _, c in expected), rel=1e-5)


def test_any_causal_lm_works_without_a_flops_count():
    torch.manual_seed(0)
    # GPT-NeoX is no backbone of the recurrence core, so the FLOPs count has no formula for its blocks.
    config = GPTNeoXConfig(
        vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=16,
    )  # fmt: skip
    neox = GPTNeoXForCausalLM(config).eval()
    ids = torch.randint(0, 99, (40,))
    result = windowed_perplexity(neox, ids, 12, 5, show_progress=False)
    total, count = reference_nll(neox, ids, 12, 5)
    assert result.num_tokens == count and result.nll == pytest.approx(total / count, rel=1e-5)
    assert result.flops_per_token is None


def test_llama_reads_windows_with_its_flops_count():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()
    ids = torch.randint(0, 99, (40,))
    result = windowed_perplexity(llama, ids, 12, 5, show_progress=False)
    total, count = reference_nll(llama, ids, 12, 5)
    assert result.num_tokens == count and result.nll == pytest.approx(total / count, rel=1e-5)
    assert result.flops_per_token == flops_per_token(llama.config, 12, 5)
    with pytest.raises(ValueError, match="window_size=17"):
        windowed_perplexity(llama, ids, 17, 0, show_progress=False)


def test_stock_defaults_to_the_position_table_without_overlap(gpt2):
    ids = torch.randint(0, 99, (40,))
    result = windowed_perplexity(gpt2, ids, show_progress=False)
    assert (result.window_size, result.overlap) == (TINY_GPT2["n_positions"], 0)
    assert result.nll == pytest.approx(windowed_perplexity(gpt2, ids.tolist(), 16, 0, show_progress=False).nll)


@pytest.mark.parametrize("family", ["recurrent_gpt2", "recurrent_llama"])
@pytest.mark.parametrize("overlap", [0, 3])
def test_recurrent_model_equals_its_own_loss(overlap, family, monkeypatch):
    # Chunks that split windows, so the state and the boundary predictions cross calls.
    monkeypatch.setattr(perplexity, "RECURRENT_CHUNK_TOKENS", 11)
    if family == "recurrent_gpt2":
        model = recurrent_model(window_overlap=overlap).train()
    else:
        torch.manual_seed(0)
        model = RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(window_overlap=overlap)).train()
    documents = [torch.randint(0, 99, (length,)) for length in (23, 70, 5)]
    # Two documents per forward: the batches are (70, 23) right-padded, then (5,).
    result = windowed_perplexity(model, documents, batch_size=2, show_progress=False)

    assert model.training, "the training mode is restored"
    model.eval()
    with torch.no_grad():
        losses = [model(doc[None], labels=doc[None]).loss.item() for doc in documents]
    total = sum(loss * (len(doc) - 1) for loss, doc in zip(losses, documents, strict=True))
    assert result.num_tokens == 22 + 69 + 4
    assert (result.window_size, result.overlap) == (8, overlap)
    assert result.nll == pytest.approx(total / result.num_tokens, rel=1e-5)


@pytest.fixture(scope="module")
def transformer_xl():
    torch.manual_seed(0)
    # Wide initial weights: sharper predictions, so reading with and without the memory differs clearly.
    return TransformerXLLMHeadModel(tiny_transformer_xl_config(initializer_range=0.5)).eval()


def test_transformer_xl_is_read_with_its_memory_and_equals_its_own_loss(transformer_xl, monkeypatch):
    # Chunks of 11 columns: the evaluation must round them to whole segments (8) to keep the one-shot schedule.
    monkeypatch.setattr(perplexity, "RECURRENT_CHUNK_TOKENS", 11)
    documents = [torch.randint(1, 99, (length,)) for length in (23, 70, 5)]
    result = windowed_perplexity(transformer_xl, documents, batch_size=2, show_progress=False)

    with torch.no_grad():
        losses = [transformer_xl(doc[None], labels=doc[None]).loss.item() for doc in documents]
    total = sum(loss * (len(doc) - 1) for loss, doc in zip(losses, documents, strict=True))
    assert (result.window_size, result.overlap, result.flops_per_token) == (8, 0, None)
    assert result.nll == pytest.approx(total / result.num_tokens, rel=1e-5)
    # The memory matters: independent 8-token windows would score these documents differently.
    with torch.no_grad():
        independent = sum(
            transformer_xl(doc[None, start : start + 9], labels=doc[None, start : start + 9]).loss.item()
            * (len(doc[start : start + 9]) - 1)
            for doc in documents
            for start in range(0, len(doc) - 1, 8)
        )
    assert abs(independent / result.num_tokens - result.nll) > 0.01


@pytest.mark.parametrize("family", ["recurrent_gpt2", "transformer_xl"])
def test_the_state_is_passed_under_the_installed_transformers_name(family, transformer_xl, monkeypatch):
    # transformers 5.24 warns once per process that `past_key_values` is deprecated: record every call instead.
    from transformers.utils import generic

    warned = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda message, *args: warned.append(message))
    model = transformer_xl if family == "transformer_xl" else RecurrentGPT2LMHeadModel(tiny_recurrent_config()).eval()
    documents = [torch.randint(1, 99, (length,)) for length in (23, 40)]
    windowed_perplexity(model, documents, batch_size=2, show_progress=False)
    assert not [message for message in warned if "deprecated" in message]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"window_size": 16}, r"window_size=16 .*segment_length=8"), ({"overlap": 2}, r"overlap=2 .*mem_len=6")],
)
def test_transformer_xl_refuses_another_schedule(transformer_xl, kwargs, named):
    with pytest.raises(ValueError, match=named):
        windowed_perplexity(transformer_xl, torch.randint(1, 99, (30,)), show_progress=False, **kwargs)


def test_evaluate_module_reads_transformer_xl_with_its_memory(transformer_xl):
    documents = [torch.randint(1, 99, (40,)).tolist(), torch.randint(1, 99, (23,)).tolist()]
    result = evaluate.load(METRIC_PATH).compute(input_ids=documents, model=transformer_xl)
    assert result == pytest.approx(windowed_perplexity(transformer_xl, documents, show_progress=False).to_dict())
    assert (result["window_size"], result["overlap"]) == (8, 0)


def test_recurrent_model_at_another_window_size_reads_that_window():
    model = recurrent_model(window_overlap=2)
    resized = RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=2, window_size=12)).eval()
    resized.load_state_dict(model.state_dict())
    ids = torch.randint(0, 99, (50,))
    result = windowed_perplexity(model, ids, window_size=12, show_progress=False)

    assert model.config.window_size == 8, "the model's config is untouched"
    with torch.no_grad():
        assert result.nll == pytest.approx(resized(ids[None], labels=ids[None]).loss.item(), rel=1e-5)
    assert result.flops_per_token != windowed_perplexity(model, ids, show_progress=False).flops_per_token


def test_another_window_size_leaves_the_model_config_untouched(monkeypatch):
    # The window once went through model.config for the whole evaluation, so another thread's model(ids) used it.
    monkeypatch.setattr(perplexity, "RECURRENT_CHUNK_TOKENS", 11)
    model = recurrent_model(window_overlap=2)
    resized = RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=2, window_size=12)).eval()
    resized.load_state_dict(model.state_dict())
    documents = [torch.randint(0, 99, (length,)) for length in (50, 31)]
    seen_windows = []

    def config_window_size(module, args, kwargs):
        seen_windows.append(module.config.window_size)

    model.register_forward_pre_hook(config_window_size, with_kwargs=True)
    result = windowed_perplexity(model, documents, window_size=12, show_progress=False)

    assert len(seen_windows) == 5 and set(seen_windows) == {8}
    with torch.no_grad():
        losses = [resized(doc[None], labels=doc[None]).loss.item() for doc in documents]
    total = sum(loss * (len(doc) - 1) for loss, doc in zip(losses, documents, strict=True))
    assert result.window_size == 12
    assert result.nll == pytest.approx(total / result.num_tokens, rel=1e-5)


def test_word_perplexity_normalises_the_total_by_words(gpt2):
    ids = torch.randint(0, 99, (30,))
    by_count = windowed_perplexity(gpt2, ids, 16, 4, num_words=10, show_progress=False)
    by_text = windowed_perplexity(gpt2, ids, 16, 4, text=["one two three", "four five six seven\neight  nine ten"])
    assert by_count.num_words == by_text.num_words == 10
    assert by_count.word_perplexity == pytest.approx(math.exp(by_count.nll * 29 / 10))
    assert by_text.word_perplexity == pytest.approx(by_count.word_perplexity)
    assert by_count.to_dict()["word_perplexity"] == by_count.word_perplexity


def test_progress_bar_counts_predicted_tokens(gpt2, capsys):
    windowed_perplexity(gpt2, torch.randint(0, 99, (30,)), 16, 4, show_progress=True)
    assert "29/29" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"window_size": 8, "overlap": 8}, "overlap=8"),
        ({"window_size": 8, "overlap": -1}, "overlap=-1"),
        ({"window_size": 17}, "window_size=17"),
        ({"window_size": 0}, "window_size=0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"num_words": 0}, "num_words=0"),
    ],
)
def test_bad_schedule_for_a_stock_model_raises(gpt2, kwargs, named):
    with pytest.raises(ValueError, match=named):
        windowed_perplexity(gpt2, torch.randint(0, 99, (30,)), show_progress=False, **kwargs)


@pytest.mark.parametrize("document", [[], [5], torch.zeros(0, dtype=torch.long)])
def test_empty_document_raises(gpt2, document):
    with pytest.raises(ValueError, match=r"has [01] token|no document"):
        windowed_perplexity(gpt2, [torch.randint(0, 99, (30,)), document], show_progress=False)


def test_recurrent_model_refuses_another_overlap():
    model = recurrent_model(window_overlap=3)
    with pytest.raises(ValueError, match=r"overlap=0 .*config.window_overlap=3"):
        windowed_perplexity(model, torch.randint(0, 99, (30,)), overlap=0, show_progress=False)
    with pytest.raises(ValueError, match="window_size=17"):
        windowed_perplexity(model, torch.randint(0, 99, (30,)), window_size=17, show_progress=False)


def test_evaluate_module_loads_offline_and_agrees(gpt2):
    documents = [torch.randint(0, 99, (40,)).tolist(), torch.randint(0, 99, (23,)).tolist()]
    metric = evaluate.load(METRIC_PATH)
    result = metric.compute(input_ids=documents, model=gpt2, window_size=16, overlap=5, num_words=20)
    expected = windowed_perplexity(gpt2, documents, 16, 5, num_words=20, show_progress=False)
    assert result == pytest.approx(expected.to_dict())
    with pytest.raises(ValueError, match="overlap=16"):
        metric.compute(input_ids=documents, model=gpt2, window_size=16, overlap=16)


def test_evaluate_module_loads_a_model_from_a_directory(gpt2, tmp_path):
    gpt2.save_pretrained(tmp_path)
    documents = [torch.randint(0, 99, (40,)).tolist()]
    result = evaluate.load(METRIC_PATH).compute(input_ids=documents, model=str(tmp_path), window_size=8, overlap=2)
    assert result["nll"] == pytest.approx(windowed_perplexity(gpt2, documents, 8, 2, show_progress=False).nll)
