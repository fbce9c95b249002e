"""Recurrent GPT-2 with generate(), the text-generation pipeline and streaming."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TextStreamer

from hf_recurrence import RecurrentGPT2LMHeadModel

from ...common import (
    TINY_GPT2,
    assert_cache_implementation_is_refused,
    generated_alone_and_batched,
    greedy_loop,
    greedy_text,
    stdlib_tokenizer,
    tiny_recurrent_config,
)


def make_model(**overrides) -> RecurrentGPT2LMHeadModel:
    return RecurrentGPT2LMHeadModel(tiny_recurrent_config(**overrides)).eval()


@pytest.mark.parametrize("overlap", [0, 3])
def test_greedy_generate_far_past_n_positions_equals_argmax_loop(overlap):
    model = make_model(window_overlap=overlap)
    prompt = torch.randint(1, 99, (1, 5))
    new_tokens = 5 * model.config.n_positions  # 80 tokens: 10+ windows
    generated = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    assert generated.shape == (1, 5 + new_tokens)
    torch.testing.assert_close(generated, greedy_loop(model, prompt, new_tokens), rtol=0, atol=0)


def test_stock_gpt2_of_the_same_size_cannot_run_that_length():
    gpt2 = GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()
    with pytest.raises((IndexError, RuntimeError)):
        gpt2(torch.randint(1, 99, (1, 5 + 5 * TINY_GPT2["n_positions"])))


def test_left_padded_batch_generates_what_each_prompt_generates_alone():
    model = make_model(window_overlap=2)
    prompts = [torch.randint(1, 99, (1, n)) for n in (11, 4, 7)]
    width = max(p.shape[1] for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1] :], mask[i, width - p.shape[1] :] = p, 1
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        alone = model.generate(p, max_new_tokens=30, do_sample=False)
        torch.testing.assert_close(batched[i, width:], alone[0, p.shape[1] :], rtol=0, atol=0)


def test_beam_search_matches_stock_gpt2_inside_the_first_window_and_runs_across_windows(tmp_path):
    gpt2 = GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()
    gpt2.save_pretrained(tmp_path)
    model = RecurrentGPT2LMHeadModel.from_pretrained(tmp_path, window_size=16, insertion_layer=1).eval()
    prompt = torch.randint(1, 99, (2, 4))
    kwargs = {"num_beams": 3, "do_sample": False, "early_stopping": True, "length_penalty": 1.0}
    expected = gpt2.generate(prompt, max_new_tokens=10, **kwargs)
    torch.testing.assert_close(model.generate(prompt, max_new_tokens=10, **kwargs), expected, rtol=0, atol=0)
    long = model.generate(prompt, max_new_tokens=40, num_return_sequences=2, **kwargs)
    assert long.shape == (4, 44)


def test_sampling_is_reproducible_and_returns_several_sequences():
    model = make_model()
    prompt = torch.randint(1, 99, (1, 3))
    torch.manual_seed(7)
    first = model.generate(prompt, max_new_tokens=40, do_sample=True, top_k=20, num_return_sequences=3)
    torch.manual_seed(7)
    second = model.generate(prompt, max_new_tokens=40, do_sample=True, top_k=20, num_return_sequences=3)
    assert first.shape == (3, 43)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_generate_continues_from_a_given_state():
    model = make_model(window_overlap=1)
    ids = torch.randint(1, 99, (1, 20))
    state = model(ids[:, :13]).past_key_values
    continued = model.generate(ids, past_key_values=state, max_new_tokens=12, do_sample=False)
    torch.testing.assert_close(continued, greedy_loop(model, ids, 12), rtol=0, atol=0)


def test_text_streamer_prints_the_generated_text(capsys):
    tokenizer = stdlib_tokenizer()
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(vocab_size=len(tokenizer))).eval()
    inputs = tokenizer("import os\n", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=40, do_sample=False, streamer=TextStreamer(tokenizer))
    printed = capsys.readouterr().out
    assert printed.strip() == tokenizer.decode(output[0]).strip()


def test_text_generation_pipeline_batches_like_single_prompts():
    tokenizer = stdlib_tokenizer()
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(vocab_size=len(tokenizer), window_overlap=2)).eval()
    prompts = ["def main():\n    return", "x = 1"]
    alone = generated_alone_and_batched(
        model, tokenizer, prompts, max_new_tokens=40, do_sample=False, return_full_text=False
    )
    assert alone == [greedy_text(model, tokenizer, p, 40) for p in prompts]
    # Far past the 16-entry position table.
    assert len(tokenizer(alone[0]).input_ids) >= 30


@pytest.mark.parametrize("implementation", ["offloaded_static", "offloaded", "quantized", "dynamic", "paged"])
def test_a_cache_implementation_is_refused_with_the_reason(implementation, tmp_path):
    assert_cache_implementation_is_refused(make_model(), implementation, tmp_path)
