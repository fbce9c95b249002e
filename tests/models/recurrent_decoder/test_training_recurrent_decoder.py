"""Training the recurrence core, over the representative backbones (shared base: `backbones.py`): backpropagation
through time reaches earlier windows only through the recurrence and `bptt_windows` truncates it, window
checkpointing gives the same loss and gradients while keeping only the per-window bottleneck, and the stock Trainer
trains on long blocks with and without it."""

import pytest
import torch
from transformers import Trainer

from ...common import RandomBlocks, loss_and_gradients, tiny_training_arguments
from .backbones import BY_NAME, REPRESENTATIVE, by_backbone, ids


def _window_token_sets(windows: int, per_window: int = 8):
    """Input whose windows use disjoint token ranges, so a token's embedding gradient says which window it came from."""
    tokens = torch.cat([torch.randint(10 + 20 * w, 30 + 20 * w, (1, per_window)) for w in range(windows)], dim=1)
    return tokens, [set(tokens[0, w * per_window : (w + 1) * per_window].tolist()) for w in range(windows)]


def _embedding_rows_with_gradient(model) -> set[int]:
    grad = model.get_input_embeddings().weight.grad
    return set(torch.nonzero(grad.abs().sum(1) > 0).flatten().tolist())


def _trained_untied(backbone, steps: int = 3, **settings):
    """The core over `backbone` with untied embeddings (so an embedding row's gradient comes from the input alone),
    after a few training steps, in training mode."""
    model, _ = backbone.models(text={"tie_word_embeddings": False}, **settings)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens = torch.randint(0, 99, (2, 24))
        model(tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def _reached_by_the_last_window(model) -> tuple[set[int], list[set[int]]]:
    """The embedding rows a loss on the last of three windows reaches, and the token sets of the three windows."""
    tokens, token_sets = _window_token_sets(windows=3)
    labels = tokens.clone()
    labels[:, :17] = -100  # positions 16..23 predict window 2's tokens
    model.zero_grad()
    model(tokens, labels=labels).loss.backward()
    return _embedding_rows_with_gradient(model), token_sets


@by_backbone(REPRESENTATIVE)
def test_later_window_loss_reaches_the_first_window_only_through_the_recurrence(backbone):
    model = _trained_untied(backbone)
    reached, token_sets = _reached_by_the_last_window(model)
    only_first = token_sets[0] - token_sets[1] - token_sets[2]
    assert only_first and only_first <= reached
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.recurrence.parameters())


@by_backbone(REPRESENTATIVE)
def test_bptt_windows_truncates_the_gradient(backbone):
    model = _trained_untied(backbone, bptt_windows=1)
    reached, token_sets = _reached_by_the_last_window(model)
    assert token_sets[1] <= reached
    assert not (token_sets[0] - token_sets[1] - token_sets[2]) & reached


# The representative rows with every schedule, GPT-2 with reentrant checkpointing too, Phi-3 (its fused attention
# projections) once.
CHECKPOINTING = [
    *(
        (backbone, overrides, use_reentrant)
        for backbone in REPRESENTATIVE
        for overrides in ({}, {"window_overlap": 3}, {"bptt_windows": 2})
        for use_reentrant in ((False, True) if backbone.name == "gpt2" else (False,))
    ),
    (BY_NAME["phi3"], {"window_overlap": 2}, False),
]


@pytest.mark.parametrize(
    ("backbone", "overrides", "use_reentrant"),
    CHECKPOINTING,
    ids=[f"{b.name}-{'_'.join(f'{k}={v}' for k, v in o.items()) or 'default'}-{r}" for b, o, r in CHECKPOINTING],
)
def test_window_checkpointing_gives_the_same_loss_and_gradients(backbone, overrides, use_reentrant):
    model, _ = backbone.models(**overrides)
    model.train()
    tokens = ids(length=50)
    labels = tokens.clone()
    labels[1, 10:14] = -100

    plain_loss, plain_grads = loss_and_gradients(model, tokens, labels)
    model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
    # Whole window steps are recomputed, not the stock layers inside them.
    assert model.window_step.gradient_checkpointing
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.backbone.modules())
    checked_loss, checked_grads = loss_and_gradients(model, tokens, labels)
    torch.testing.assert_close(checked_loss, plain_loss)
    assert checked_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checked_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


@by_backbone(REPRESENTATIVE)
def test_window_checkpointing_with_frozen_embeddings_still_trains_inner_weights(backbone):
    # A frozen backbone with trainable inner weights (what PEFT's LoRA does): nothing fed to a window requires grad.
    model, _ = backbone.models()
    model.train()
    trained = next(n for n, _ in model.named_parameters() if ".0." in n and ("q_proj" in n or "c_attn" in n))
    for name, parameter in model.named_parameters():
        parameter.requires_grad = name == trained
    tokens = ids(length=24)

    def gradient():
        torch.manual_seed(3)
        model.zero_grad()
        model(tokens, labels=tokens).loss.backward()
        return model.get_parameter(trained).grad.clone()

    plain = gradient()
    model.activation_checkpointing_enable()
    torch.testing.assert_close(gradient(), plain)
    assert plain.abs().sum() > 0


@by_backbone(REPRESENTATIVE)
def test_window_checkpointing_keeps_only_the_bottleneck(backbone):
    # What autograd keeps alive between forward and backward, parameters excluded: with window checkpointing only
    # the per-window bottleneck (h_prev path, losses) survives, so 12 windows keep less than one unchecked window.
    def saved_bytes(model, windows):
        parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen, total = set(), 0

        def pack(t):
            nonlocal total
            storage = t.untyped_storage().data_ptr()
            if storage not in parameters and storage not in seen:
                seen.add(storage)
                total += t.untyped_storage().nbytes()
            return t

        tokens = torch.randint(0, 99, (1, 8 * windows))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens, labels=tokens)
        return total

    # A 64-wide backbone with a 256-wide MLP (GPT-2 names its width n_inner).
    mlp = "n_inner" if "n_inner" in backbone.overrides else "intermediate_size"
    model, _ = backbone.models(text={"hidden_size": 64, mlp: 256}, recurrence_hidden_sizes=[8])
    model.train()
    plain_one, plain_twelve = saved_bytes(model, 1), saved_bytes(model, 12)
    model.activation_checkpointing_enable()
    checked_twelve = saved_bytes(model, 12)
    assert plain_twelve > 8 * plain_one
    assert checked_twelve < plain_one / 4


@pytest.mark.parametrize("checkpointing", [False, True])
@by_backbone([BY_NAME["llama"], BY_NAME["gpt2"]])
def test_trainer_trains_on_long_blocks(tmp_path, backbone, checkpointing):
    model, _ = backbone.models(window_overlap=2)
    before = model.recurrence.ffn[0].weight.detach().clone()
    args = tiny_training_arguments(tmp_path, gradient_accumulation_steps=2, activation_checkpointing=checkpointing)
    trainer = Trainer(model=model, args=args, train_dataset=RandomBlocks(8, 48), eval_dataset=RandomBlocks(4, 48))
    result = trainer.train()
    assert model.window_step.gradient_checkpointing is checkpointing
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(before, model.recurrence.ffn[0].weight)
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
