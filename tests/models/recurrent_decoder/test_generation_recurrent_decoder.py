"""The recurrence core with generate(), the text-generation pipeline and streaming, over the representative backbones
(shared base: `backbones.py`; greedy generation past the position table on every row: test_backbones_recurrent_decoder.py)."""

import pytest
import torch
from transformers import TextStreamer

from ...common import (
    assert_cache_implementation_is_refused,
    assert_forward_keeps_its_signature,
    generated_alone_and_batched,
    greedy_loop,
    greedy_text,
    stdlib_tokenizer,
)
from .backbones import BY_NAME, REPRESENTATIVE, by_backbone, ids


@by_backbone(REPRESENTATIVE)
def test_beam_search_matches_the_stock_model_inside_the_first_window_and_runs_across_windows(backbone):
    model, stock = backbone.models(window_size=16)
    prompt = ids(length=4)
    kwargs = {"num_beams": 3, "do_sample": False, "early_stopping": True, "length_penalty": 1.0}
    expected = stock.generate(prompt, max_new_tokens=10, **kwargs)
    assert torch.equal(model.generate(prompt, max_new_tokens=10, **kwargs), expected)
    long = model.generate(prompt, max_new_tokens=40, min_new_tokens=40, num_return_sequences=2, **kwargs)
    assert long.shape == (4, 44)


def test_sampling_is_reproducible_and_returns_several_sequences():
    model, _ = BY_NAME["llama"].models()
    prompt = ids(1, 3)
    torch.manual_seed(7)
    first = model.generate(prompt, max_new_tokens=40, do_sample=True, top_k=20, num_return_sequences=3)
    torch.manual_seed(7)
    second = model.generate(prompt, max_new_tokens=40, do_sample=True, top_k=20, num_return_sequences=3)
    assert first.shape == (3, 43)
    assert torch.equal(first, second)


@by_backbone(REPRESENTATIVE)
def test_generate_continues_from_a_given_state(backbone):
    model, _ = backbone.models(window_overlap=1)
    tokens = ids(1, 20)
    state = model(tokens[:, :13]).past_key_values
    continued = model.generate(tokens, past_key_values=state, max_new_tokens=12, do_sample=False)
    assert torch.equal(continued, greedy_loop(model, tokens, 12))


@by_backbone(REPRESENTATIVE)
def test_generating_past_the_position_table_gives_no_maximum_length_warning(backbone):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    model, _ = backbone.models()
    positions = model.config.text_config.max_position_embeddings
    # The reminder is logged once per process: forget an earlier test's, so that this generation would log it again.
    logging.get_logger("transformers").warning_once.__func__.cache_clear()
    with CaptureLogger(logging.get_logger("transformers.generation.stopping_criteria")) as captured:
        generated = model.generate(ids(1, 5), max_new_tokens=2 * positions, min_new_tokens=32, do_sample=False)
    assert generated.shape[1] > positions
    assert "maximum length" not in captured.out


def test_text_streamer_prints_the_generated_text(capsys):
    tokenizer = stdlib_tokenizer()
    model, _ = BY_NAME["gpt2"].models(text={"vocab_size": len(tokenizer)})
    inputs = tokenizer("import os\n", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=40, do_sample=False, streamer=TextStreamer(tokenizer))
    printed = capsys.readouterr().out
    assert printed.strip() == tokenizer.decode(output[0]).strip()


def test_text_generation_pipeline_batches_like_single_prompts_and_generates_greedily():
    tokenizer = stdlib_tokenizer()
    model, _ = BY_NAME["gpt2"].models(text={"vocab_size": len(tokenizer)}, window_overlap=2)
    prompts = ["def main():\n    return", "x = 1"]
    alone = generated_alone_and_batched(
        model, tokenizer, prompts, max_new_tokens=40, do_sample=False, return_full_text=False
    )
    assert alone == [greedy_text(model, tokenizer, p, 40) for p in prompts]
    # Far past the 16-entry position table.
    assert len(tokenizer(alone[0]).input_ids) >= 30


@pytest.mark.parametrize("implementation", ["offloaded_static", "offloaded", "quantized", "dynamic", "paged"])
def test_a_cache_implementation_is_refused_with_the_reason(implementation, tmp_path):
    model, _ = BY_NAME["llama"].models()
    assert_cache_implementation_is_refused(model, implementation, tmp_path)


def test_the_forward_keeps_its_signature_for_generates_per_token_remote_code_check():
    assert_forward_keeps_its_signature(BY_NAME["llama"].models()[0])
