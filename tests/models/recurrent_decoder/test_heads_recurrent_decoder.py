"""The bare recurrence core (`RecurrentDecoderModel`, over the stock base model) and its sequence and token
classification heads (transformers' generic heads), over a few rows of the backbone table: the first window is the
stock base model, the state carries a document across calls, a left-padded row is the row alone, and stock
classifier checkpoints load with only the recurrence new; and the named GPT-2 and Llama heads' names, layers and stock
checkpoints. The one home of the classification heads' tests."""

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedModel,
    Trainer,
)
from transformers.utils import ModelOutput

from hf_recurrence import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderForTokenClassification,
    RecurrentDecoderModel,
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentLlamaForSequenceClassification,
)

from ...common import ACROSS_KERNELS, assert_loads_with_remote_code, tiny_training_arguments
from ...families import BACKBONES, NAMED_DECODERS, Backbone


PAD = 0
SETTINGS = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16]}
# The same arithmetic in another order (per-call steps, another mask layout) moves float32 results by rounding only.
ROUNDING = {"rtol": 1e-5, "atol": 1e-5}
ROWS = [backbone for backbone in BACKBONES if backbone.name in ("llama", "qwen3", "gemma3_text", "gpt2")]
by_backbone = pytest.mark.parametrize("backbone", ROWS, ids=[backbone.name for backbone in ROWS])


def core(backbone: Backbone, model_class: type[PreTrainedModel], **settings) -> PreTrainedModel:
    """`model_class` over the backbone, with recurrence weights large enough that h_prev matters, in eval mode."""
    torch.manual_seed(0)
    config = RecurrentDecoderConfig(text_config=backbone.text_config(), num_labels=3, **{**SETTINGS, **settings})
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "recurrence." in name:
                parameter.normal_(0, 0.5, generator=generator)
    return model


def document(length: int = 30) -> torch.Tensor:
    """(2, length) ids past the 16-entry position tables, the second row left-padded by 7."""
    ids = torch.randint(1, 99, (2, length), generator=torch.Generator().manual_seed(1))
    ids[1, :7] = PAD
    return ids


# The name transformers gives the state in model inputs and outputs: `cache` from 5.24 on.
STATE_NAME = "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) else "past_key_values"


def state_of(output) -> object:
    return output.get("cache", output.get("past_key_values"))


def test_auto_classes_resolve_to_the_core():
    config = RecurrentDecoderConfig(text_config=ROWS[0].text_config(), **SETTINGS)
    assert type(AutoModel.from_config(config)) is RecurrentDecoderModel
    assert type(AutoModelForSequenceClassification.from_config(config)) is RecurrentDecoderForSequenceClassification
    assert type(AutoModelForTokenClassification.from_config(config)) is RecurrentDecoderForTokenClassification
    assert {"AutoModel", "AutoModelForSequenceClassification", "AutoModelForTokenClassification"} <= set(
        config.auto_map
    )


@by_backbone
def test_bare_model_first_window_is_the_stock_base_model(backbone):
    model = core(backbone, RecurrentDecoderModel)
    stock = AutoModel.from_config(backbone.text_config()).eval()
    stock.load_state_dict(model.backbone.state_dict())
    ids = document()[:1]
    layers = backbone.text_config().num_hidden_layers
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_attentions=True)
        expected = stock(ids[:, :8]).last_hidden_state  # after the stock final norm
    assert out.last_hidden_state.shape == (1, 30, 32)
    torch.testing.assert_close(out.last_hidden_state[:, :8], expected, **ROUNDING)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
    assert len(out.hidden_states) == layers + 1 and len(out.attentions) == layers
    assert out.attentions[0].shape[-1] == 1 + SETTINGS["window_size"]
    assert state_of(out).get_seq_length() == 30
    # Later windows see h_prev: the recurrence is there.
    with torch.no_grad():
        alone = model(ids[:, 8:16]).last_hidden_state
    assert (out.last_hidden_state[:, 8:16] - alone).abs().max() > 1e-3


@by_backbone
def test_bare_model_chunked_calls_carrying_the_state_equal_one_call(backbone):
    model = core(backbone, RecurrentDecoderModel, window_overlap=3)
    ids = document()
    mask = (ids != PAD).long()
    real = mask.bool()
    with torch.no_grad():
        whole = model(ids, attention_mask=mask).last_hidden_state
        pieces, state = [], None
        for start, stop in ((0, 5), (5, 19), (19, 30)):
            out = model(ids[:, start:stop], attention_mask=mask[:, :stop], past_key_values=state)
            pieces.append(out.last_hidden_state)
            state = state_of(out)
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], whole[real], **ROUNDING)


@by_backbone
@pytest.mark.parametrize("overlap", [0, 3])
def test_sequence_head_left_padded_rows_equal_each_row_alone_after_reading_all_of_it(backbone, overlap):
    model = core(backbone, RecurrentDecoderForSequenceClassification, window_overlap=overlap)
    ids = document()
    mask = (ids != PAD).long()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        hidden = model.model(ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(logits, model.score(hidden[:, -1]), **ROUNDING)
        torch.testing.assert_close(logits[0], model(ids[:1]).logits[0], **ROUNDING)
        torch.testing.assert_close(logits[1], model(ids[1:, 7:]).logits[0], **ROUNDING)
        # Right padding finds the same last token.
        right_padded = torch.cat([ids[1:, 7:], torch.full((1, 7), PAD)], dim=1)
        right = model(right_padded, attention_mask=(right_padded != PAD).long()).logits
        torch.testing.assert_close(right, logits[1:], **ROUNDING)
        # Read in two calls carrying the state: the last call's scores are the one call's.
        first = model(ids[:, :13], attention_mask=mask[:, :13])
        # Under the installed transformers' name: 5.24's generic heads deprecate `past_key_values` for `cache`.
        rest = model(ids[:, 13:], attention_mask=mask, **{STATE_NAME: state_of(first)})
        torch.testing.assert_close(rest.logits, logits, **ROUNDING)
        # The first token reaches the scores through the carried state.
        changed = ids.clone()
        changed[0, 0] = changed[0, 0] % 98 + 1
        assert not torch.equal(model(changed, attention_mask=mask).logits[0], logits[0])


@by_backbone
def test_token_head_scores_every_token(backbone):
    model = core(backbone, RecurrentDecoderForTokenClassification)
    ids = document()
    mask = (ids != PAD).long()
    labels = torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(ids, attention_mask=mask, labels=labels)
        hidden = model.model(ids, attention_mask=mask).last_hidden_state
    assert out.logits.shape == (2, 30, 3)
    torch.testing.assert_close(out.logits, model.score(hidden), **ROUNDING)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1))
    torch.testing.assert_close(out.loss, expected, **ROUNDING)


@by_backbone
def test_stock_classifier_checkpoint_loads_with_only_the_recurrence_new(backbone, tmp_path):
    text_config = backbone.text_config()
    text_config.num_labels = 3
    torch.manual_seed(0)
    stock = AutoModelForSequenceClassification.from_config(text_config).eval()
    stock.save_pretrained(tmp_path)
    model, info = RecurrentDecoderForSequenceClassification.from_pretrained(
        tmp_path, output_loading_info=True, **SETTINGS
    )
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert info["missing_keys"] and all(".recurrence." in key for key in info["missing_keys"])
    assert model.config.num_labels == 3 and model.config.text_config.model_type == backbone.name
    ids = torch.randint(1, 99, (1, 8))  # one window: no h_prev yet
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, stock(ids).logits, **ACROSS_KERNELS)


@by_backbone
def test_save_and_load_round_trip_in_the_stock_layout(backbone, tmp_path):
    model = core(backbone, RecurrentDecoderForSequenceClassification)
    ids = document()
    mask = (ids != PAD).long()
    model.save_pretrained(tmp_path / "classifier")
    with safe_open(str(tmp_path / "classifier" / "model.safetensors"), "pt") as file:
        saved = set(file.keys())
    stock_prefix = "transformer." if backbone.name == "gpt2" else "model."
    assert {key.split(".")[0] for key in saved} == {stock_prefix[:-1], "recurrence", "score"}
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "classifier").eval()
    assert type(reloaded) is RecurrentDecoderForSequenceClassification
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits, **ACROSS_KERNELS
        )
    # A causal model's checkpoint has the same layout: its backbone and recurrence start a classifier.
    causal = core(backbone, RecurrentDecoderForCausalLM)
    causal.save_pretrained(tmp_path / "causal")
    classifier, info = RecurrentDecoderForSequenceClassification.from_pretrained(
        tmp_path / "causal", output_loading_info=True
    )
    assert info["missing_keys"] == {"score.weight"}
    for name, tensor in causal.recurrence.state_dict().items():
        assert torch.equal(classifier.model.recurrence.state_dict()[name], tensor), name
    bare = AutoModel.from_pretrained(tmp_path / "causal").eval()
    assert type(bare) is RecurrentDecoderModel
    with torch.no_grad():
        expected = causal(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        torch.testing.assert_close(bare(ids, attention_mask=mask).last_hidden_state, expected, **ACROSS_KERNELS)


def test_the_classifier_keeps_the_recurrence_across_attention_implementations_and_checkpointing():
    model = core(ROWS[0], RecurrentDecoderForSequenceClassification)
    ids = document()
    labels = torch.tensor([0, 2])
    with torch.no_grad():
        expected = model(ids).logits
        model.set_attn_implementation("eager")
        assert model.model.backbone.config._attn_implementation == "recurrent_eager"
        torch.testing.assert_close(model(ids).logits, expected, **ROUNDING)
    with pytest.raises(ValueError, match="'flash_attention_2' cannot carry the recurrence"):
        model.set_attn_implementation("flash_attention_2")
    model.set_attn_implementation("sdpa")
    model.train()
    plain = torch.autograd.grad(model(ids, labels=labels).loss, model.model.recurrence.ffn[0].weight)[0]
    # Whole window steps are recomputed; the stock layers inside are not checkpointed again.
    model.activation_checkpointing_enable()
    assert model.model.window_step.gradient_checkpointing
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.model.backbone.modules())
    checkpointed = torch.autograd.grad(model(ids, labels=labels).loss, model.model.recurrence.ffn[0].weight)[0]
    torch.testing.assert_close(checkpointed, plain, **ROUNDING)


def test_trainer_fine_tunes_the_sequence_head_and_compute_metrics_gets_scores(tmp_path):
    assert_trainer_fine_tunes_the_sequence_head(core(ROWS[-1], RecurrentDecoderForSequenceClassification), tmp_path)


@pytest.mark.remote_code
def test_heads_and_bare_model_load_as_remote_code_in_a_fresh_interpreter(tmp_path):
    assert_sequence_head_loads_as_remote_code(
        core(ROWS[1], RecurrentDecoderForSequenceClassification),
        document(),
        tmp_path,
        checks="""
folder = model.name_or_path
for auto_class, suffix in (("AutoModelForTokenClassification", "ForTokenClassification"), ("AutoModel", "Model")):
    other = getattr(transformers, auto_class).from_pretrained(folder, trust_remote_code=True)
    assert type(other).__name__ == "RecurrentDecoder" + suffix, type(other)
""",
    )


# The named recurrent decoders' heads: transformers' generic GPT-2 and Llama heads (GPT-2's token head names its layer
# `classifier`), over the recurrence core.
NAMED_HEADS = {family.name: (family.tiny_config, *family.other_heads) for family in NAMED_DECODERS}
by_named_family = pytest.mark.parametrize("family", list(NAMED_HEADS))


def named_head(family: str, head: int, **overrides) -> PreTrainedModel:
    tiny_config, *classes = NAMED_HEADS[family]
    torch.manual_seed(0)
    return classes[head](tiny_config(num_labels=3, pad_token_id=PAD, **overrides)).eval()


@by_named_family
def test_auto_classes_resolve_to_the_named_heads(family):
    tiny_config, sequence_class, token_class = NAMED_HEADS[family]
    config = tiny_config(num_labels=3)
    assert type(AutoModelForSequenceClassification.from_config(config)) is sequence_class
    assert type(AutoModelForTokenClassification.from_config(config)) is token_class


@by_named_family
def test_the_named_token_heads_score_every_token_with_their_stock_layer(family):
    model = named_head(family, 1)
    ids = document()
    mask = (ids != PAD).long()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        hidden = model.base_model(ids, attention_mask=mask).last_hidden_state
    classifier = model.classifier if family == "recurrent_gpt2" else model.score
    torch.testing.assert_close(logits, classifier(hidden), **ROUNDING)


@pytest.mark.parametrize(
    ("stock", "ours", "config"),
    [
        (GPT2ForSequenceClassification, RecurrentGPT2ForSequenceClassification, GPT2Config),
        (GPT2ForTokenClassification, RecurrentGPT2ForTokenClassification, GPT2Config),
        (LlamaForSequenceClassification, RecurrentLlamaForSequenceClassification, LlamaConfig),
    ],
    ids=lambda value: value.__name__,
)
def test_stock_gpt2_and_llama_classifier_checkpoints_load_into_the_named_heads(stock, ours, config, tmp_path):
    sizes = {"vocab_size": 100, "num_labels": 3, "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": 2}
    if config is GPT2Config:
        sizes |= {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 16}
    else:
        sizes |= {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
        sizes |= {"num_key_value_heads": 2, "max_position_embeddings": 16}
    torch.manual_seed(0)
    stock_model = stock(config(**sizes)).eval()
    stock_model.save_pretrained(tmp_path)
    model, info = ours.from_pretrained(tmp_path, window_size=16, insertion_layer=1, output_loading_info=True)
    assert not info["unexpected_keys"]
    assert info["missing_keys"] and all(".recurrence." in key for key in info["missing_keys"])
    # Within the first window there is no h_prev: the stock model's scores.
    ids = torch.randint(3, 100, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, stock_model(ids).logits, **ACROSS_KERNELS)


@pytest.mark.remote_code
@by_named_family
def test_the_named_heads_load_as_remote_code_in_a_fresh_interpreter(family, tmp_path):
    assert_sequence_head_loads_as_remote_code(
        named_head(family, 0),
        document(),
        tmp_path,
        checks="""
token_model = transformers.AutoModelForTokenClassification.from_pretrained(model.name_or_path, trust_remote_code=True)
assert type(token_model).__name__.endswith("ForTokenClassification"), type(token_model)
""",
    )


def assert_trainer_fine_tunes_the_sequence_head(model, tmp_path) -> None:
    """The stock Trainer trains `model` (3 labels, a `score` layer) on documents of 40 tokens, and compute_metrics
    gets only the scores (the state is left out of the gathered predictions)."""

    class Documents(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(1, 99, (40,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": torch.tensor(i % 3)}

    seen = {}

    def compute_metrics(prediction) -> dict:
        seen["shape"] = np.asarray(prediction.predictions).shape
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    before = model.score.weight.detach().clone()
    args = tiny_training_arguments(tmp_path, per_device_eval_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=Documents(), compute_metrics=compute_metrics)
    trainer.train()
    metrics = trainer.evaluate(Documents())
    assert not torch.equal(model.score.weight, before)
    assert seen["shape"] == (8, 3) and "eval_accuracy" in metrics


def assert_sequence_head_loads_as_remote_code(model, document: torch.Tensor, tmp_path, checks: str) -> None:
    """`assert_loads_with_remote_code` for a sequence head on a left-padded `document` (the mask from `PAD`)."""
    inputs = {"input_ids": document, "attention_mask": (document != PAD).long()}
    assert_loads_with_remote_code(model, inputs, tmp_path, "AutoModelForSequenceClassification", checks=checks)
