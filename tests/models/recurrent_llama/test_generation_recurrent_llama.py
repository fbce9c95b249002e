"""Recurrent Llama generating far past max_position_embeddings without transformers' maximum-length reminder. What
generate() does over every backbone is tested on the recurrent GPT-2, on every backbone row and every family."""

import torch

from hf_recurrence import RecurrentLlamaForCausalLM

from ...common import tiny_recurrent_llama_config


def make_model(**overrides) -> RecurrentLlamaForCausalLM:
    return RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(**overrides)).eval()


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
