"""The recurrence core over stock GPT-2 and Llama computes what today's `RecurrentGPT2LMHeadModel` and
`RecurrentLlamaForCausalLM` compute with the same weights: logits (left padding, overlap, chunked calls), greedy
generation past the position table, the loss and its gradients. Different code paths, so compared within float32
rounding, not bit for bit."""

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

from hf_recurrence import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentGPT2LMHeadModel,
    RecurrentLlamaForCausalLM,
)

from ...common import TINY_GPT2, TINY_LLAMA, tiny_recurrent_config, tiny_recurrent_llama_config


SETTINGS = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16, 16]}
# float32 results of the same arithmetic in another order (per-step head calls, another mask layout).
ROUNDING = {"rtol": 1e-5, "atol": 1e-5}


def pair(family: str, attn_implementation: str, overlap: int, **settings):
    """Today's model with random recurrence weights large enough that h_prev matters, and the core with its
    weights; `settings`: further recurrence settings for both."""
    torch.manual_seed(0)
    if family == "gpt2":
        today = RecurrentGPT2LMHeadModel(
            tiny_recurrent_config(
                **SETTINGS, **settings, window_overlap=overlap, attn_implementation=attn_implementation
            )
        )
        text_config = GPT2Config(**TINY_GPT2)
    else:
        today = RecurrentLlamaForCausalLM(
            tiny_recurrent_llama_config(
                **SETTINGS, **settings, window_overlap=overlap, attn_implementation=attn_implementation
            )
        )
        text_config = LlamaConfig(**TINY_LLAMA)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in today.base_model.recurrence.parameters():
            parameter.normal_(0, 0.5, generator=generator)
    config = RecurrentDecoderConfig(
        text_config=text_config,
        **SETTINGS,
        **settings,
        window_overlap=overlap,
        attn_implementation=attn_implementation,
    )
    core = RecurrentDecoderForCausalLM(config)
    weights = {}
    for name, tensor in today.state_dict().items():
        prefix, _, rest = name.partition(".recurrence.")
        weights[f"recurrence.{rest}" if rest else f"backbone.{name}"] = tensor
    core.load_state_dict(weights, strict=True)
    return today.eval(), core.eval()


CASES = pytest.mark.parametrize(
    ("family", "attn_implementation", "overlap"),
    [(f, a, o) for f in ("gpt2", "llama") for a in ("sdpa", "eager") for o in (0, 3)],
)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 30 tokens, two of them left-padded."""
    ids = torch.randint(1, 99, (3, 30), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :11] = 0
    return ids, mask


@CASES
def test_logits_and_chunked_calls_equal_todays_model(family, attn_implementation, overlap):
    today, core = pair(family, attn_implementation, overlap)
    ids, mask = inputs()
    real = mask.bool()
    with torch.no_grad():
        expected = today(ids, attention_mask=mask).logits
        torch.testing.assert_close(core(ids, attention_mask=mask).logits[real], expected[real], **ROUNDING)
        pieces, state = [], None
        for start, stop in ((0, 7), (7, 19), (19, 20), (20, 30)):
            out = core(ids[:, start:stop], attention_mask=mask[:, :stop], past_key_values=state)
            pieces.append(out.logits)
            state = out.past_key_values
        torch.testing.assert_close(torch.cat(pieces, dim=1)[real], expected[real], **ROUNDING)


@CASES
def test_generate_past_the_position_table_equals_todays_model(family, attn_implementation, overlap):
    today, core = pair(family, attn_implementation, overlap)
    ids, mask = inputs()
    kwargs = {"attention_mask": mask[:, -12:], "max_new_tokens": 30, "min_new_tokens": 30, "do_sample": False}
    expected = today.generate(ids[:, -12:], **kwargs)
    assert expected.shape[1] == 42 > 16
    assert torch.equal(core.generate(ids[:, -12:], **kwargs), expected)


@CASES
def test_loss_and_gradients_equal_todays_model(family, attn_implementation, overlap):
    today, core = pair(family, attn_implementation, overlap)
    ids, _ = inputs()
    expected = today(ids, labels=ids).loss
    loss = core(ids, labels=ids).loss
    torch.testing.assert_close(loss, expected, **ROUNDING)
    expected.backward()
    loss.backward()
    for (name, theirs), ours in zip(
        today.base_model.recurrence.named_parameters(), core.recurrence.parameters(), strict=True
    ):
        torch.testing.assert_close(ours.grad, theirs.grad, **ROUNDING, msg=f"recurrence.{name}")
    embeddings = today.get_input_embeddings().weight.grad
    torch.testing.assert_close(core.get_input_embeddings().weight.grad, embeddings, **ROUNDING)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("rope_position", [None, 0, -1])
def test_h_prev_rope_position_equals_todays_llama(rope_position, attn_implementation):
    today, core = pair("llama", attn_implementation, 3, h_prev_rope_position=rope_position)
    ids, mask = inputs()
    real = mask.bool()
    with torch.no_grad():
        expected = today(ids, attention_mask=mask).logits
        torch.testing.assert_close(core(ids, attention_mask=mask).logits[real], expected[real], **ROUNDING)
