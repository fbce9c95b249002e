# SPDX-License-Identifier: Apache-2.0
"""What `generate()` needs of the recurrence core's causal LMs, as a mixin of [`RecurrentDecoderForCausalLM`] (as
transformers keeps Whisper's in `generation_whisper.py`): its hooks (the state instead of a transformers Cache, no
maximum length, no continuous batching) and the decode path of `generate(cache_implementation="static")`, whose
single-token step over a fixed-shape state ([`FixedShapeWindowCache`]) runs as one compiled graph that also writes
the state in place.

Example:

```python
>>> import torch
>>> from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel

>>> config = RecurrentGPT2Config(
...     vocab_size=100, n_layer=2, n_embd=32, n_head=2, n_positions=16, window_size=16, insertion_layer=1
... )
>>> model = RecurrentGPT2LMHeadModel(config)
>>> ids = torch.randint(3, 100, (1, 20))
>>> out = model.generate(ids, cache_implementation="static", max_new_tokens=20, min_new_tokens=20, do_sample=False)
>>> out.shape  # 40 tokens: past the 16-entry position table, in three windows
torch.Size([1, 40])

```
"""

import functools
import inspect
import json
import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation import CompileConfig, MaxLengthCriteria, StoppingCriteriaList
from transformers.utils.deprecation import deprecate_kwarg

from .state_recurrent_decoder import (
    FIXED_SHAPE_CACHE_IMPLEMENTATION,
    STATE_NAME,
    RecurrentDecoderState,
    _gather_slots,
    _right_packing_index,
    fixed_shape_state_class,
)
from .step_recurrent_decoder import _StepSettings, kept_token_slots, merge_pooled


def _renaming_the_state_arguments(generate: Callable) -> Callable:
    """`generate` with the stock generate()'s renames of the state's old argument names (transformers 5.24 on), done
    before it runs, so that their deprecation warning names the caller, as the stock generate()'s does, rather than
    the override that calls it."""
    if STATE_NAME != "past_key_values":
        for old_name in ("past_key_values", "cache_params"):
            generate = deprecate_kwarg(old_name, "6.0.0", new_name=STATE_NAME)(generate)
    return generate


class RecurrentDecoderGenerationMixin(GenerationMixin):
    """generate() over the recurrent state: the hooks a causal LM of the core overrides, and its single-token decode
    over a fixed-shape state (`_decode_token`)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # generate() builds inspect.signature(model.forward) at every token of a model registered for the Auto
        # classes, as ours are (transformers' check whether remote code still takes `cache_position`): a signature
        # kept on the function is read instead of built.
        forward = cls.__dict__.get("forward")
        if forward is not None:
            forward.__signature__ = inspect.signature(forward)

    @_renaming_the_state_arguments
    @functools.wraps(GenerationMixin.generate)
    def generate(self, *args, **kwargs):
        # generate() reads its text with fixed weights, so h_prev's keys and values at the reading layers are
        # computed once per window and kept in the state (`RecurrentDecoderState.h_prev_key_values`) instead of at
        # every token. Outside generate() they are computed in every call: weights may change between calls on one
        # state (training, an adapter switched on or off).
        reading = self.__dict__.get("_reads_with_fixed_weights", False)
        self.__dict__["_reads_with_fixed_weights"] = True
        try:
            return super().generate(*args, **kwargs)
        finally:
            self.__dict__["_reads_with_fixed_weights"] = reading

    def _get_stopping_criteria(self, *args, **kwargs) -> StoppingCriteriaList:
        criteria = super()._get_stopping_criteria(*args, **kwargs)
        for criterion in criteria:
            if isinstance(criterion, MaxLengthCriteria):
                # Positions restart in every window, so a text longer than max_position_embeddings is what this model
                # is for: transformers' reminder that generation "exceeded the model's predefined maximum length"
                # would be wrong.
                criterion.max_position_embeddings = None
        return criteria

    def _prepare_cache_for_generation(
        self,
        generation_config: GenerationConfig,
        model_kwargs: dict,
        generation_mode: object,
        batch_size: int,
        *args,
        **kwargs,
    ):
        implementation = generation_config.cache_implementation
        if implementation == FIXED_SHAPE_CACHE_IMPLEMENTATION:
            if model_kwargs.get(STATE_NAME) is None and generation_config.use_cache is not False:
                weight = self.get_input_embeddings().weight
                state_class = fixed_shape_state_class(self.state_class)
                # generate() expands the rows for beams and returned sequences after this, as for the stock cache.
                rows = max(generation_config.num_beams, generation_config.num_return_sequences) * batch_size
                model_kwargs[STATE_NAME] = state_class(self.config, rows, weight.device, weight.dtype)
                return None
        elif implementation is not None:
            # generate() would only warn that a cache_implementation "will be ignored" and run anyway.
            raise ValueError(
                f"cache_implementation={implementation!r} cannot be honoured by {type(self).__name__}: the model "
                f"carries its own recurrent state of bounded size (returned as {STATE_NAME}) instead of a transformers "
                f"Cache; the only choice is {FIXED_SHAPE_CACHE_IMPLEMENTATION!r}, that state in fixed-shape buffers "
                "whose single-token step compiles. Remove cache_implementation from the generate() call or from the "
                "generation config (generation_config.json)"
            )
        return super()._prepare_cache_for_generation(
            generation_config, model_kwargs, generation_mode, batch_size, *args, **kwargs
        )

    def _valid_auto_compile_criteria(self, model_kwargs: dict, generation_config: GenerationConfig) -> bool:
        state = model_kwargs.get(STATE_NAME)
        if getattr(state, "fixed_shape", False):
            # Compiling the whole forward would trace the window loop and its host-side schedule; only the
            # single-token step is compiled (see `_fixed_shape_decode`).
            state.compile_config = _step_compile_config(self, generation_config)
            return False
        return super()._valid_auto_compile_criteria(model_kwargs, generation_config)

    def init_continuous_batching(self, *args, **kwargs):
        # generate(cache_implementation="paged") and generate_batch() come here, past _prepare_cache_for_generation.
        raise ValueError(
            f"Continuous batching (cache_implementation='paged', generate_batch()) cannot be used with "
            f"{type(self).__name__}: it needs a paged key/value cache, and the model carries its own recurrent state "
            "instead. Call generate() without cache_implementation; batched prompts may be left-padded"
        )

    def _decode_token(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        state: object | None,
        use_cache: bool | None,
        return_logits: bool | None,
        logits_to_keep: int | torch.Tensor,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
    ) -> torch.Tensor | None:
        """generate()'s single-token call over a fixed-shape state set to compile, the compiled step alone: the
        (batch, 1, vocab) logits, or None where the call is another (see `_fixed_shape_decode`) and takes the usual
        path.

        The state was checked against this model by the eager call that advanced it last (`_checked_by`); the
        single-token calls in between do not check it, the config or the inputs' device again, once per token, so
        change neither the config nor the attention implementation in the middle of a text read this way.
        """
        if getattr(state, "compile_config", None) is None:  # no state, or not a fixed-shape state set to compile
            return None
        batch = state.batch_size
        if (
            input_ids is None
            or input_ids.shape != (batch, 1)
            or (attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.shape[0] != batch))
            or (attention_mask is not None and attention_mask.shape[1] < 1)
            or use_cache is False
            or return_logits is False
            or not isinstance(logits_to_keep, int)
            or logits_to_keep < 0
            or state._checked_by is None
            or state._checked_by() is not self
            or any(self._output_flags(output_hidden_states, output_attentions))
        ):
            return None
        # The mask's last column as it is (a view: its dtype is made bool inside the compiled step, with the
        # embedding lookup, so that neither costs an eager operator at every token).
        real = None if attention_mask is None else attention_mask[:, -1:]
        if real is not None and real.device != input_ids.device:
            real = real.to(input_ids.device)
        return _fixed_shape_decode(self, state, input_ids, real)


def _fixed_shape_decode(
    model: PreTrainedModel, state: RecurrentDecoderState, tokens: torch.Tensor, real: torch.Tensor | None
) -> torch.Tensor | None:
    """The (batch, 1, vocab) logits of one new column (`tokens`: its (batch, 1) ids or (batch, 1, hidden) embeddings;
    `real`: (batch, 1), nonzero where the column is real, or None where every row's is) over a
    fixed-shape state with a `compile_config`, from one compiled step that also writes the cache and advances the
    state in place; None where the state is not such a state, gradients are on, or some row may begin a window in
    this step (that step runs eagerly: it re-reads the overlap and computes the new `h_prev`). The caller checks that
    the call asks for nothing else (logits of its one column, no loss, hidden states or attentions, no document start).

    Reads nothing from the device but once after each eager step (`decodes_inside_windows`); leaves the lockstep,
    since whether the column is real is not read.
    """
    if (
        state.compile_config is None  # set on fixed-shape states only
        or torch.is_grad_enabled()
        or not state.decodes_inside_windows()
    ):
        return None
    h_prev_kv = _pinned_h_prev_key_values(model, state.h_prev_key_value(model))
    state.leave_lockstep()
    _pin_step_tensors(model, state)
    step = _compiled_decode(model, state.compile_config)
    logits = step(
        _decode_settings(state.window_size),
        tokens,
        real,
        state.fill,
        state.slot_valid,
        state.window_index,
        state.h_prev,
        h_prev_kv,
        state.pooled_sum,
        state.pooled_weight,
        state.pooled_reference,
        state.overlap_embeds,
        state.overlap_valid,
        *state.keys,
        *state.values,
    )
    state._fill_bound += 1
    state.seen_tokens += 1
    return logits


# The state's tensors the compiled single-token step reads and writes, beside each layer's `keys` and `values`.
_STEP_TENSORS = (
    "fill",
    "slot_valid",
    "window_index",
    "h_prev",
    "pooled_sum",
    "pooled_weight",
    "pooled_reference",
    "overlap_embeds",
    "overlap_valid",
)


def _step_tensor_places(state: RecurrentDecoderState) -> list[tuple[str, int | None]]:
    """Where each of those tensors is: (attribute, index in its list or None)."""
    return [(name, None) for name in _STEP_TENSORS] + [
        (name, i) for name in ("keys", "values") for i in range(len(getattr(state, name)))
    ]


def _step_tensors(state: RecurrentDecoderState) -> list[torch.Tensor]:
    """The tensors at `_step_tensor_places(state)`, in that order, gathered at once (the per-token check)."""
    return [getattr(state, name) for name in _STEP_TENSORS] + state.keys + state.values


def _get_step_tensor(state: RecurrentDecoderState, place: tuple[str, int | None]) -> torch.Tensor:
    name, index = place
    return getattr(state, name) if index is None else getattr(state, name)[index]


def _set_step_tensor(state: RecurrentDecoderState, place: tuple[str, int | None], tensor: torch.Tensor) -> None:
    name, index = place
    if index is None:
        setattr(state, name, tensor)
    else:
        getattr(state, name)[index] = tensor


def _pin_step_tensors(model: PreTrainedModel, state: RecurrentDecoderState) -> None:
    """Give the tensors the compiled step reads and writes in place fixed addresses: the model's pinned tensors
    (`torch._dynamo.mark_static_address`), which `state` takes over, its values copied in where an eager step (a new
    window, the prompt) left new tensors.

    CUDA graphs (the compile mode "reduce-overhead", generate()'s default) replay a compiled step only if the inputs
    it mutates are static, as the stock static cache's are; the pins stay the model's across generate() calls, so a
    new call of the same shapes re-records no graph. One state holds the pins at a time: the state that held them
    before gets copies of its own first.
    """
    pins = model.__dict__.get("_step_pins")
    tensors = _step_tensors(state)
    held = pins is not None and pins["holder"] is not None and pins["holder"]() is state
    if held and len(tensors) == len(pins["tensors"]) and all(map(operator.is_, tensors, pins["tensors"])):
        return  # every token but those after an eager step: nothing to copy, no shapes to compare
    places = _step_tensor_places(state)
    pins = _static_pins(model, "_step_pins", tensors)
    pins.setdefault("holder", None)
    holder = pins["holder"]() if pins["holder"] is not None else None
    if holder is not None and holder is not state:
        for place, pin in zip(places, pins["tensors"], strict=True):
            if _get_step_tensor(holder, place) is pin:
                _set_step_tensor(holder, place, pin.clone())
    for place, pin, tensor in zip(places, pins["tensors"], tensors, strict=True):
        if tensor is not pin:
            pin.copy_(tensor)
            _set_step_tensor(state, place, pin)
    pins["holder"] = weakref.ref(state)


def _pinned_h_prev_key_values(
    model: PreTrainedModel, kept: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """`kept` (h_prev's key and value at each reading layer, which the compiled step only reads) in the model's
    pinned tensors, marked static, copied in when `kept` is not the one copied last (a new window, another state).

    CUDA graphs copy every input that is not static into the graph's own memory at each replay: one copy per reading
    layer's key and value at every token (60 for a memory read at SmolLM2's 30 layers), for values that change once
    a window."""
    pins = model.__dict__.get("_h_prev_kv_pins")
    if pins is not None and pins.get("source") is kept:
        return pins["key_values"]  # every token inside a window: the same dict as at the token before
    kept_tensors = [t for pair in kept.values() for t in pair]
    pins = _static_pins(model, "_h_prev_kv_pins", kept_tensors)
    if pins.get("key_values", {}).keys() != kept.keys():
        pinned = iter(pins["tensors"])
        pins["key_values"] = {layer: (next(pinned), next(pinned)) for layer in kept}
    for pin, tensor in zip(pins["tensors"], kept_tensors, strict=True):
        pin.copy_(tensor)
    pins["source"] = kept
    return pins["key_values"]


def _static_pins(model: PreTrainedModel, name: str, tensors: list[torch.Tensor]) -> dict[str, Any]:
    """The model's pins under `name`: a dict whose "tensors" are one tensor of each of `tensors`' shape, dtype and
    device, marked static (`torch._dynamo.mark_static_address`); made again where that layout changed, or where they
    were made under inference_mode and it is now off (inference tensors, which nothing outside it may write)."""
    pins = model.__dict__.get(name)
    layout = [(t.shape, t.dtype, t.device) for t in tensors]
    inference = torch.is_inference_mode_enabled()
    if pins is None or pins["layout"] != layout or (pins["inference"] and not inference):
        pins = {"layout": layout, "inference": inference, "tensors": [torch.empty_like(t) for t in tensors]}
        for pin in pins["tensors"]:
            torch._dynamo.mark_static_address(pin)
        model.__dict__[name] = pins
    return pins


@functools.cache
def _decode_settings(window_size: int) -> _StepSettings:
    """The settings of a compiled single-token step: one object per window size, so its guards always pass."""
    return _StepSettings(
        num_new=1,
        window_size=window_size,
        logits_to_keep=1,
        step_head=None,
        output_hidden_states=False,
        output_attentions=False,
        uses_h_prev=True,
        all_real=None,
    )


def _decode_in_place(
    model: PreTrainedModel,
    settings: _StepSettings,
    tokens: torch.Tensor,
    real: torch.Tensor | None,
    fill: torch.Tensor,
    slot_valid: torch.Tensor,
    window_index: torch.Tensor,
    h_prev: torch.Tensor,
    h_prev_kv: dict[int, tuple[torch.Tensor, torch.Tensor]],
    pooled_sum: torch.Tensor,
    pooled_weight: torch.Tensor,
    pooled_reference: torch.Tensor,
    overlap_embeds: torch.Tensor,
    overlap_valid: torch.Tensor,
    *buffers: torch.Tensor,
) -> torch.Tensor:
    """One single-token step inside every row's window over a fixed-shape state's tensors, updated in place as
    `append_step` would: the step's key/value written into the buffers (a real column at its window position,
    padding into the spare slot), `slot_valid`, `fill`, the pooled states and the overlap. `h_prev_kv`: h_prev's
    key and value at each reading layer; `tokens` and `real` as `_fixed_shape_decode` takes them. Returns the step's
    logits."""
    embeds = model.get_input_embeddings()(tokens) if tokens.dim() == 2 else tokens  # (batch, 1, hidden)
    if real is None:
        real = torch.ones(embeds.shape[0], 1, dtype=torch.bool, device=embeds.device)
    real = real.bool()  # (batch, 1)
    column = real[:, 0]  # (batch,)
    slot = torch.where(column, fill, settings.window_size)  # (batch,)
    # Every layer writes the column's key/value into its buffers itself, before attending over them.
    step = model._step(
        settings,
        embeds,
        real,
        fill,
        slot_valid,
        window_index > 0,
        h_prev,
        pooled_sum,
        None,
        *buffers,
        h_prev_kv=h_prev_kv,
        write_slots=slot,
    )
    slot_valid[torch.arange(slot.shape[0], device=slot.device), slot] = column  # in place, as the buffers' writes
    fill.add_(column.long())
    pooled = (pooled_sum, pooled_weight, pooled_reference)
    for kept, merged in zip(pooled, merge_pooled(pooled, step.pooled, kept_token_slots(model.config)), strict=True):
        kept.copy_(merged)
    if overlap_embeds.shape[1]:
        kept_embeds = torch.cat([overlap_embeds, embeds], dim=1)
        kept_real = torch.cat([overlap_valid, real], dim=1)
        index = _right_packing_index(kept_real, overlap_embeds.shape[1])
        overlap_embeds.copy_(_gather_slots(kept_embeds, index, 1))
        overlap_valid.copy_(kept_real.gather(1, index))
    return step.result


def _compiled_decode(model: PreTrainedModel, compile_config: CompileConfig) -> Callable:
    """`_decode_in_place` over `model` compiled with `compile_config`'s options; one per model and options."""
    # Looked up once per token: the last config object's step is kept, so its options are not read again.
    last = model.__dict__.get("_last_compiled_step")
    if last is not None and last[0] is compile_config:
        return last[1]
    options = compile_config.to_dict()
    key = json.dumps(options, sort_keys=True, default=repr)
    compiled = model.__dict__.setdefault("_compiled_steps", {})
    if key not in compiled:
        compiled[key] = torch.compile(functools.partial(_decode_in_place, model), **options)
    model.__dict__["_last_compiled_step"] = (compile_config, compiled[key])
    return compiled[key]


def _step_compile_config(model: PreTrainedModel, generation_config: GenerationConfig) -> CompileConfig | None:
    """How generate() compiles the single-token step: on the devices, and with the options, with which it compiles a
    stock model's forward over the stock static cache; None where it would not."""
    config = generation_config.compile_config or CompileConfig()
    compiles = model.device.type in ("cuda", "xpu", "neuron", "tpu") or bool(config._compile_all_devices)
    return config if compiles and not generation_config.disable_compile else None


__all__ = ["RecurrentDecoderGenerationMixin"]
