"""Transformer-XL with generate(), beam search, left-padded batches and the text-generation pipeline."""

import pytest
import torch
from transformers import pipeline

from hf_recurrence import TransformerXLLMHeadModel

from ...common import (
    assert_cache_implementation_is_refused,
    assert_forward_keeps_its_signature,
    greedy_text,
    stdlib_tokenizer,
    tiny_transformer_xl_config,
)


def make_model(**overrides) -> TransformerXLLMHeadModel:
    return TransformerXLLMHeadModel(tiny_transformer_xl_config(**overrides)).eval()


def greedy_loop(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Argmax over the cached computation: the prompt in one call, then one token per call with the state."""
    with torch.no_grad():
        out = model(prompt)
        ids = prompt
        for _ in range(new_tokens):
            next_token = out.logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_token], dim=1)
            out = model(next_token, past_key_values=out.past_key_values)
    return ids


def left_pad(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(p.shape[1] for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1] :], mask[i, width - p.shape[1] :] = p, 1
    return ids, mask


def test_greedy_generate_of_ten_spans_equals_argmax_loop():
    model = make_model()
    config = model.config
    prompt = torch.randint(1, 99, (2, 11))
    new_tokens = 10 * (config.segment_length + config.mem_len)
    generated = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    assert generated.shape == (2, 11 + new_tokens)
    torch.testing.assert_close(generated, greedy_loop(model, prompt, new_tokens), rtol=0, atol=0)


def test_left_padded_batch_equals_each_row_alone():
    model = make_model()
    # Longer than a segment, so that padding would shift the segment boundaries if it were read.
    prompts = [torch.randint(1, 99, (1, n)) for n in (19, 4, 11)]
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    logits = model(ids, attention_mask=mask).logits
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        torch.testing.assert_close(logits[i, width - p.shape[1] :], model(p).logits[0])
        alone = model.generate(p, max_new_tokens=30, do_sample=False)
        torch.testing.assert_close(batched[i, width:], alone[0, p.shape[1] :], rtol=0, atol=0)


def test_beam_search_runs_past_segment_and_memory():
    model = make_model()
    prompt = torch.randint(1, 99, (2, 4))
    out = model.generate(prompt, max_new_tokens=30, min_new_tokens=30, num_beams=3, num_return_sequences=2)
    assert out.shape == (4, 34)


def test_text_generation_pipeline_generates_past_segment_and_memory():
    tokenizer = stdlib_tokenizer()
    model = make_model(vocab_size=len(tokenizer), eos_token_id=None)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompts = ["def main():\n    return", "x = 1"]
    kwargs = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False, "return_full_text": False}
    alone = [generator(p, **kwargs)[0]["generated_text"] for p in prompts]
    batched = [out[0]["generated_text"] for out in generator(prompts, batch_size=2, **kwargs)]
    assert batched == alone
    assert alone == [greedy_text(model, tokenizer, p, 40) for p in prompts]
    assert len(tokenizer(alone[0]).input_ids) > model.config.segment_length + model.config.mem_len


@pytest.mark.parametrize("implementation", ["static", "offloaded", "quantized", "dynamic", "paged"])
def test_a_cache_implementation_is_refused_with_the_reason(implementation, tmp_path):
    assert_cache_implementation_is_refused(make_model(), implementation, tmp_path)


def test_the_forward_keeps_its_signature_for_generates_per_token_remote_code_check():
    assert_forward_keeps_its_signature(make_model())
