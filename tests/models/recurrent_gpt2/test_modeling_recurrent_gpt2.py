"""Recurrent GPT-2: window semantics, state equivalence, GPT-2 compatibility, BPTT and checkpointing."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel, RecurrentGPT2State

from ...common import ACROSS_KERNELS, TINY_GPT2, chunked_logits, load_over_a_stock_checkpoint, tiny_recurrent_config


def make_model(**overrides) -> RecurrentGPT2LMHeadModel:
    return RecurrentGPT2LMHeadModel(tiny_recurrent_config(**overrides)).eval()


class TestConfig:
    @pytest.mark.parametrize(
        ("changes", "match"),
        [
            # window_overlap == window_size left no room in a window: forward looped forever, memory growing.
            ({"window_overlap": 8}, "window_overlap=8"),
            ({"window_size": 4, "window_overlap": 4}, "window_overlap=4"),
            # These gave a bare IndexError from the position table or the block list.
            ({"window_size": 17}, "window_size=17 exceeds .*=16"),
            ({"window_size": 0}, "window_size=0"),
            (
                {"insertion_layer": 3},
                r"insertion_layer must be a layer index in \[0, num_hidden_layers=3\), got insertion_layer=3",
            ),
        ],
    )
    def test_changed_after_the_model_is_built_is_refused_at_forward(self, changes, match):
        model = make_model()
        ids = torch.randint(0, 99, (1, 20))
        for name, value in changes.items():
            setattr(model.config, name, value)
        with pytest.raises(ValueError, match=match):
            model(ids)

    def test_no_max_position_embeddings(self):
        # The model has no maximum length; generate() must not cap or warn at n_positions.
        assert getattr(tiny_recurrent_config(), "max_position_embeddings", None) is None


class TestForward:
    def test_labels_return_logits_in_eval_mode_only(self):
        model = make_model()
        ids = torch.randint(0, 99, (2, 20))
        # Evaluation (Trainer's prediction_step) gets the logits; training keeps the window-by-window loss.
        assert model(ids, labels=ids).logits.shape == (2, 20, 99)
        assert model(ids, labels=ids, return_logits=False).logits is None
        model.train()
        assert model(ids, labels=ids).logits is None
        assert model(ids, labels=ids, return_logits=True).logits.shape == (2, 20, 99)

    def test_num_items_in_batch_divides_the_summed_loss(self):
        model = make_model()
        ids = torch.randint(0, 99, (2, 20))
        summed = model(ids, labels=ids, num_items_in_batch=1).loss
        mean = model(ids, labels=ids).loss
        torch.testing.assert_close(summed / (2 * 19), mean)

    def test_inputs_embeds_equal_input_ids(self):
        model = make_model(window_overlap=2)
        ids = torch.randint(0, 99, (2, 30))
        embeds = model.get_input_embeddings()(ids)
        torch.testing.assert_close(model(inputs_embeds=embeds).logits, model(ids).logits)

    def test_state_batch_mismatch_is_refused(self):
        model = make_model()
        state = model(torch.randint(0, 99, (2, 5))).past_key_values
        with pytest.raises(ValueError, match=r"batch_size=2 \(the input: 3\)"):
            model(torch.randint(0, 99, (3, 1)), past_key_values=state)


class TestStateEquivalence:
    @pytest.mark.parametrize("overlap", [0, 3, 7])
    @pytest.mark.parametrize("splits", [[1], [5], [8], [13, 14, 15, 16], [3, 11, 29, 30], [20]])
    def test_chunked_equals_one_shot(self, overlap, splits):
        model = make_model(window_overlap=overlap)
        ids = torch.randint(0, 99, (2, 45))  # at least 5 windows for every overlap
        with torch.no_grad():
            full = model(ids).logits
            chunked, state = chunked_logits(model, ids, splits)
        torch.testing.assert_close(chunked, full)
        assert state.get_seq_length() == 45

    @pytest.mark.parametrize("overlap", [0, 3])
    def test_token_by_token_equals_one_shot(self, overlap):
        model = make_model(window_overlap=overlap)
        ids = torch.randint(0, 99, (2, 42))
        with torch.no_grad():
            full = model(ids).logits
            chunked, state = chunked_logits(model, ids, list(range(1, 42)))
        torch.testing.assert_close(chunked, full)
        # Memory stays bounded by one window.
        assert state.slot_valid.shape[1] <= model.config.window_size

    def test_left_padded_rows_equal_each_row_alone(self):
        model = make_model(window_overlap=3)
        lengths = [30, 23, 9]
        rows = [torch.randint(1, 99, (1, n)) for n in lengths]
        width = max(lengths)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, width - row.shape[1] :] = row
            mask[i, width - row.shape[1] :] = 1
        with torch.no_grad():
            batched, state = chunked_logits(model, ids, [7, 19], attention_mask=mask)
            for i, row in enumerate(rows):
                alone = model(row).logits
                torch.testing.assert_close(batched[i, width - row.shape[1] :], alone[0], atol=1e-5, rtol=1e-4)
        # A full window is closed lazily, when the next token arrives.
        assert state.fill.tolist() == [3 + (n - 9) % 5 + 1 if n > 8 else n for n in lengths]


class TestState:
    def test_detach_reset_to_reorder(self):
        model = make_model(window_overlap=2).train()
        state = model(torch.randint(0, 99, (3, 20))).past_key_values
        assert isinstance(state, RecurrentGPT2State)
        assert state.pooled_sum.requires_grad
        state.detach()
        tensors = [*state.keys, *state.values] + [getattr(state, n) for n in state._BATCH_TENSORS]
        assert not any(t.requires_grad for t in tensors)
        state.reorder_cache(torch.tensor([2, 2, 0]))
        assert state.batch_size == 3 and torch.equal(state.h_prev[0], state.h_prev[1])
        state.to(dtype=torch.float64)
        assert state.keys[0].dtype == torch.float64 and state.pooled_sum.dtype == torch.float32
        assert "seen_tokens=20" in repr(state)
        state.reset()
        assert state.get_seq_length() == 0 and int(state.fill.sum()) == 0 and state.slot_valid.shape[1] == 0

    def test_a_state_with_its_own_schedule_reads_like_a_model_configured_with_it(self):
        model = make_model(window_overlap=2)
        resized = make_model(window_overlap=2, window_size=12)
        resized.load_state_dict(model.state_dict())
        ids = torch.randint(0, 99, (2, 40))
        with torch.no_grad():
            state = model.new_state(2, window_size=12)
            logits = model(ids, past_key_values=state).logits
            # Same weights in two model objects: a stated tolerance, not exact equality.
            torch.testing.assert_close(logits, resized(ids).logits, **ACROSS_KERNELS)
        assert model.config.window_size == 8
        assert (state.window_size, state.window_overlap) == (12, 2)

    def test_the_schedule_of_a_run_comes_from_its_state_not_the_config(self):
        model = make_model()
        ids = torch.randint(0, 99, (1, 30))
        with torch.no_grad():
            expected = model(ids).logits
            state = model(ids[:, :13]).past_key_values
            model.config.window_size = 12  # changed mid-run: the state keeps the schedule it started with
            continued = model(ids[:, 13:], past_key_values=state).logits
        torch.testing.assert_close(continued, expected[:, 13:], **ACROSS_KERNELS)

    @pytest.mark.parametrize(
        ("schedule", "match"),
        [
            ({"window_size": 17}, "window_size=17 exceeds .*=16"),
            ({"window_size": 0}, "window_size=0"),
            ({"window_size": 4, "window_overlap": 4}, "window_overlap=4"),
        ],
    )
    def test_an_invalid_state_schedule_is_refused(self, schedule, match):
        with pytest.raises(ValueError, match=match):
            make_model().new_state(1, **schedule)

    def test_the_schedule_is_fixed_for_the_states_life(self):
        state = make_model(window_overlap=2).new_state(1)
        with pytest.raises(AttributeError):
            state.window_overlap = 3

    def test_reset_state_reads_like_a_fresh_one(self):
        model = make_model()
        ids = torch.randint(0, 99, (1, 12))
        with torch.no_grad():
            state = model(torch.randint(0, 99, (1, 30))).past_key_values.reset()
            torch.testing.assert_close(model(ids, past_key_values=state).logits, model(ids).logits)


class TestGPT2Compatibility:
    def test_first_window_equals_stock_gpt2_and_weights_load_unchanged(self, tmp_path):
        gpt2 = GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()
        model = load_over_a_stock_checkpoint(gpt2, RecurrentGPT2LMHeadModel, "recurrent_gpt2", tmp_path)
        ids = torch.randint(0, 99, (2, 8))
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, gpt2(ids).logits, **ACROSS_KERNELS)
            # Later windows differ only through h_prev and restarted positions.
            long_ids = torch.randint(0, 99, (2, 30))
            torch.testing.assert_close(model(long_ids).logits[:, :8], gpt2(long_ids[:, :8]).logits)

    def test_invalid_window_for_the_checkpoint_is_refused(self, tmp_path):
        GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).save_pretrained(tmp_path)
        with pytest.raises(ValueError, match="window_size=32 exceeds .*=16"):
            RecurrentGPT2LMHeadModel.from_pretrained(tmp_path, window_size=32)

    def test_gpt2_config_converted_without_a_window_gets_the_whole_position_table(self, tmp_path):
        # PEFT and AutoConfig reload a converted model's base config this way, with no recurrence settings.
        GPT2Config(**TINY_GPT2).save_pretrained(tmp_path)
        config = RecurrentGPT2Config.from_pretrained(tmp_path, insertion_layer=1)
        assert config.window_size == TINY_GPT2["n_positions"] == 16
        large = GPT2Config(**{**TINY_GPT2, "n_positions": 1024}).to_dict()
        assert RecurrentGPT2Config.from_dict(large, insertion_layer=1).window_size == 300


def _window_token_sets(model, windows, per_window=8):
    """Input whose windows use disjoint token ranges, so a token's embedding gradient says which window it came from."""
    ids = torch.cat([torch.randint(10 + 20 * w, 30 + 20 * w, (1, per_window)) for w in range(windows)], dim=1)
    return ids, [set(ids[0, w * per_window : (w + 1) * per_window].tolist()) for w in range(windows)]


def _embedding_rows_with_gradient(model) -> set[int]:
    grad = model.transformer.wte.weight.grad
    return set(torch.nonzero(grad.abs().sum(1) > 0).flatten().tolist())


class TestBackpropagationThroughTime:
    def _train_a_few_steps(self, model, steps=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(steps):
            ids = torch.randint(0, 99, (2, 24))
            model(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    def test_later_window_loss_reaches_first_window_only_through_recurrence(self):
        model = make_model(tie_word_embeddings=False).train()
        self._train_a_few_steps(model)
        ids, token_sets = _window_token_sets(model, windows=3)
        labels = ids.clone()
        labels[:, :17] = -100  # loss on the last window only
        model.zero_grad()
        model(ids, labels=labels).loss.backward()
        reached = _embedding_rows_with_gradient(model)
        only_first = token_sets[0] - token_sets[1] - token_sets[2]
        assert only_first and only_first <= reached
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.recurrence.parameters())

    def test_bptt_windows_truncates_gradient(self):
        model = make_model(tie_word_embeddings=False, bptt_windows=1).train()
        self._train_a_few_steps(model)
        ids, token_sets = _window_token_sets(model, windows=3)
        labels = ids.clone()
        labels[:, :17] = -100  # positions 16..23 predict window 2's tokens
        model.zero_grad()
        model(ids, labels=labels).loss.backward()
        reached = _embedding_rows_with_gradient(model)
        assert token_sets[1] <= reached
        assert not (token_sets[0] - token_sets[1] - token_sets[2]) & reached

    def test_full_bptt_reaches_window_zero_where_truncation_does_not(self):
        torch.manual_seed(1)
        full = make_model(tie_word_embeddings=False).train()
        self._train_a_few_steps(full)
        ids, token_sets = _window_token_sets(full, windows=3)
        labels = ids.clone()
        labels[:, :17] = -100
        full.zero_grad()
        full(ids, labels=labels).loss.backward()
        assert token_sets[0] <= _embedding_rows_with_gradient(full)


class TestGradientCheckpointing:
    @pytest.mark.parametrize("use_reentrant", [False, True])
    @pytest.mark.parametrize("overrides", [{}, {"window_overlap": 3}, {"bptt_windows": 2}])
    def test_same_loss_and_gradients(self, overrides, use_reentrant):
        model = make_model(**overrides).train()
        ids = torch.randint(0, 99, (2, 50))
        labels = ids.clone()
        labels[1, 10:14] = -100

        def loss_and_grads():
            torch.manual_seed(3)  # same dropout masks in both runs
            model.zero_grad()
            loss = model(ids, labels=labels).loss
            loss.backward()
            return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

        plain_loss, plain_grads = loss_and_grads()
        model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
        assert model.window_step.gradient_checkpointing
        checked_loss, checked_grads = loss_and_grads()
        torch.testing.assert_close(checked_loss, plain_loss)
        assert checked_grads.keys() == plain_grads.keys()
        for name, grad in plain_grads.items():
            torch.testing.assert_close(checked_grads[name], grad, msg=name)

    def test_frozen_embeddings_still_train_inner_weights(self):
        # A frozen backbone with trainable inner weights (what PEFT's LoRA does): nothing fed to a window requires grad.
        model = make_model().train()
        for name, parameter in model.named_parameters():
            parameter.requires_grad = name == "backbone.transformer.h.0.attn.c_attn.weight"
        ids = torch.randint(0, 99, (2, 24))

        def gradient():
            torch.manual_seed(3)
            model.zero_grad()
            model(ids, labels=ids).loss.backward()
            return model.transformer.h[0].attn.c_attn.weight.grad.clone()

        plain = gradient()
        model.activation_checkpointing_enable()
        torch.testing.assert_close(gradient(), plain)
        assert plain.abs().sum() > 0

    def test_checkpointing_keeps_only_the_bottleneck(self):
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

            ids = torch.randint(0, 99, (1, 8 * windows))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model(ids, labels=ids)
            return total

        model = make_model(n_embd=64, recurrence_hidden_sizes=[8]).train()
        plain_one, plain_twelve = saved_bytes(model, 1), saved_bytes(model, 12)
        model.activation_checkpointing_enable()
        checked_twelve = saved_bytes(model, 12)
        assert plain_twelve > 8 * plain_one
        assert checked_twelve < plain_one / 4


def test_bfloat16_runs_and_keeps_the_pooled_sum_in_float32():
    model = make_model(window_overlap=2).to(torch.bfloat16)
    ids = torch.randint(0, 99, (2, 40))
    with torch.no_grad():
        out = model(ids)
        chunked, state = chunked_logits(model, ids, [9, 17])
    assert out.logits.dtype == torch.bfloat16 and state.keys[0].dtype == torch.bfloat16
    assert state.pooled_sum.dtype == torch.float32
    torch.testing.assert_close(chunked.float(), out.logits.float(), atol=0.1, rtol=0.05)
    assert model.generate(ids[:, :3], max_new_tokens=30, do_sample=False).shape == (2, 33)


def test_padding_never_grows_the_cache_past_one_window():
    model = make_model()
    state = model(torch.randint(1, 99, (2, 3))).past_key_values
    for _ in range(5):
        pad = torch.zeros(2, 10, dtype=torch.long)
        state = model(pad, attention_mask=torch.zeros_like(pad), past_key_values=state).past_key_values
    assert state.slot_valid.shape[1] <= model.config.window_size
    assert state.fill.tolist() == [3, 3]


def test_state_is_returned_even_when_trainer_switched_config_use_cache_off():
    model = make_model()
    model.config.use_cache = False
    ids = torch.randint(1, 99, (1, 10))
    assert isinstance(model(ids).past_key_values, RecurrentGPT2State)
    assert model(ids, use_cache=False).past_key_values is None


def test_return_logits_false_without_labels_returns_only_the_state():
    out = make_model()(torch.randint(1, 99, (1, 20)), return_logits=False)
    assert out.logits is None and out.loss is None and out.past_key_values.get_seq_length() == 20
