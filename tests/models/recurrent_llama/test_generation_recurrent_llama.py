"""Recurrent Llama with generate() and the text-generation pipeline, far past max_position_embeddings."""

import pytest
import torch
from transformers import pipeline

from hf_recurrence import RecurrentLlamaForCausalLM

from ...common import greedy_loop, greedy_text, stdlib_tokenizer, tiny_recurrent_llama_config


def make_model(**overrides) -> RecurrentLlamaForCausalLM:
    return RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(**overrides)).eval()


@pytest.mark.parametrize("overlap", [0, 3])
def test_greedy_generate_far_past_max_position_embeddings_equals_argmax_loop(overlap):
    model = make_model(window_overlap=overlap)
    prompt = torch.randint(1, 99, (1, 5))
    new_tokens = 5 * model.config.max_position_embeddings  # 80 tokens: 10+ windows
    generated = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    assert generated.shape == (1, 5 + new_tokens)
    torch.testing.assert_close(generated, greedy_loop(model, prompt, new_tokens), rtol=0, atol=0)


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
        alone = model.generate(p, max_new_tokens=30, do_sample=False)[0, p.shape[1] :]
        # A row that generated EOS (id 0) alone stops there; in the batch it is padded with id 0 after it.
        torch.testing.assert_close(batched[i, width : width + len(alone)], alone, rtol=0, atol=0)
        assert not batched[i, width + len(alone) :].any()


def test_text_generation_pipeline_batches_like_single_prompts():
    tokenizer = stdlib_tokenizer()
    model = RecurrentLlamaForCausalLM(
        tiny_recurrent_llama_config(vocab_size=len(tokenizer), window_overlap=2, pad_token_id=tokenizer.pad_token_id)
    ).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompts = ["def main():\n    return", "x = 1"]
    kwargs = {"max_new_tokens": 40, "do_sample": False, "return_full_text": False}
    alone = [generator(p, **kwargs)[0]["generated_text"] for p in prompts]
    batched = [out[0]["generated_text"] for out in generator(prompts, batch_size=2, **kwargs)]
    assert batched == alone
    assert alone == [greedy_text(model, tokenizer, p, 40) for p in prompts]
    assert len(tokenizer(alone[0]).input_ids) >= 30  # far past the 16 RoPE positions


@pytest.mark.parametrize("cache_implementation", ["offloaded_static", "paged"])
def test_cache_implementation_is_refused_with_the_reason(cache_implementation):
    with pytest.raises(ValueError, match="cache_implementation|Continuous batching"):
        make_model().generate(
            torch.randint(1, 99, (1, 4)), max_new_tokens=3, cache_implementation=cache_implementation
        )


def test_generating_past_max_position_embeddings_gives_no_maximum_length_warning():
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    model = make_model()
    prompt = torch.randint(1, 99, (1, 5))
    # The reminder is logged once per process: forget an earlier test's, so that this generation would log it again.
    logging.get_logger("transformers").warning_once.__func__.cache_clear()
    with CaptureLogger(logging.get_logger("transformers.generation.stopping_criteria")) as captured:
        generated = model.generate(
            prompt, max_new_tokens=2 * model.config.max_position_embeddings, min_new_tokens=32, do_sample=False
        )
    assert generated.shape[1] > model.config.max_position_embeddings
    assert "maximum length" not in captured.out
