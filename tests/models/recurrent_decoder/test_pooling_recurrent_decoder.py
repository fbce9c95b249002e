"""How the recurrence core pools a window into h_prev, over the backbone table (shared base: `backbones.py`): the
recurrence network of a layer-weighted mean, optionally of RMS-normalised states, and the control whose h_prev is a
learned constant that ignores the text."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError

from hf_recurrence import RecurrentDecoderConfig

from ...common import chunked_logits
from .backbones import BY_NAME, REPRESENTATIVE, by_backbone, ids


@by_backbone()
def test_control_h_prev_is_a_learned_constant_that_ignores_the_text(backbone):
    control, _ = backbone.models(recurrence_input="zeros")
    tokens = ids(1, 16)
    changed = tokens.clone()
    changed[0, :8] = tokens[0, :8].flip(0)
    with torch.no_grad():
        torch.testing.assert_close(control(tokens).logits[:, 8:], control(changed).logits[:, 8:])
        # ... but it is there: window 2 differs from the same tokens read as a first window.
        assert not torch.allclose(control(tokens).logits[:, 8:], control(tokens[:, 8:]).logits)


@by_backbone()
@pytest.mark.parametrize("normalize", [False, True])
def test_h_prev_is_the_recurrence_of_the_layer_weighted_mean(backbone, normalize):
    model, _ = backbone.models(normalize_pooled_states=normalize)
    logits = torch.tensor([0.5, -1.0, 2.0])
    with torch.no_grad():
        model.recurrence.layer_weight_logits.copy_(logits)
        tokens = ids(2, 9)  # one full window, then one token that closes it
        layer_outputs = torch.stack(model(tokens[:, :8], output_hidden_states=True).hidden_states[1:])
        state = model(tokens, use_cache=True).past_key_values
        # Read one token at a time (the single-column step pools one column over all layers in one product).
        _, token_by_token = chunked_logits(model, tokens, range(1, 9))
    if normalize:  # with the backbone's own RMS-norm epsilon
        eps = getattr(model.config.text_config, "rms_norm_eps", None) or 1e-6
        layer_outputs = layer_outputs * torch.rsqrt(layer_outputs.pow(2).mean(-1, keepdim=True) + eps)
    weights = torch.softmax(logits, dim=0)
    summary = (weights[:, None, None] * layer_outputs.mean(2)).sum(0)  # (batch, hidden)
    # The paper's one slot: h_prev (batch, 1, hidden).
    torch.testing.assert_close(state.h_prev, model.recurrence(summary[:, None]))
    torch.testing.assert_close(token_by_token.h_prev, state.h_prev)


@by_backbone(REPRESENTATIVE)
def test_normalized_pooling_ignores_a_token_with_huge_activations(backbone):
    # An attention-sink-like first token, 1000x the others: it dominates the plain mean, not the normalized one.
    model, _ = backbone.models(normalize_pooled_states=True)
    plain, _ = backbone.models(normalize_pooled_states=False)
    plain.load_state_dict(model.state_dict())
    embeds = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(5))
    louder = embeds.clone()
    louder[0, 0] *= 1000
    with torch.no_grad():
        memory = {
            name: [m(inputs_embeds=e, use_cache=True).past_key_values.h_prev for e in (embeds, louder)]
            for name, m in (("normalized", model), ("plain", plain))
        }
    normalized_change = (memory["normalized"][0] - memory["normalized"][1]).norm()
    plain_change = (memory["plain"][0] - memory["plain"][1]).norm()
    assert normalized_change < plain_change / 10


@by_backbone(REPRESENTATIVE)
@pytest.mark.parametrize("overrides", [{"normalize_pooled_states": True}, {"recurrence_input": "zeros"}])
def test_chunked_equals_one_shot_for_the_pooling_and_control_switches(backbone, overrides):
    model, _ = backbone.models(window_overlap=3, **overrides)
    tokens = ids(length=45)
    with torch.no_grad():
        full = model(tokens).logits
        chunked, _ = chunked_logits(model, tokens, [3, 11, 29, 30])
    torch.testing.assert_close(chunked, full)


def test_an_unknown_recurrence_input_is_refused_and_the_pooling_switch_takes_only_a_bool():
    settings = {"text_config": BY_NAME["llama"].text_config(), "window_size": 8}
    with pytest.raises(ValueError, match="recurrence_input='noise'"):
        RecurrentDecoderConfig(**settings, recurrence_input="noise")
    # transformers' strict config dataclass checks the declared type, as for every bool field of a config.
    with pytest.raises(StrictDataclassFieldValidationError, match="normalize_pooled_states"):
        RecurrentDecoderConfig(**settings, normalize_pooled_states=1)
