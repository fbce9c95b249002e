"""The analytic FLOPs count against the paper's FLOPs/token column and the recurrence's overhead."""

import pytest
from transformers import (
    BertConfig,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    SmolLM3Config,
)

from hf_recurrence import RecurrentDecoderConfig, RecurrentGPT2Config, RecurrentLlamaConfig
from hf_recurrence.evaluation import flops_per_token


# Paper Table 2 (PG-19), GPT-2 small with 300-token windows: overlap -> FLOPs/token.
PAPER_GPT2_SMALL_T300 = {
    0: 1.75e8, 5: 1.78e8, 10: 1.81e8, 30: 1.94e8, 50: 2.10e8, 75: 2.33e8, 100: 2.62e8, 150: 3.50e8, 200: 5.25e8
}  # fmt: skip


@pytest.mark.parametrize(("overlap", "paper"), sorted(PAPER_GPT2_SMALL_T300.items()))
def test_gpt2_small_matches_the_papers_column(overlap, paper):
    # The paper's rows are its rounded 1.75e8 times 300 / (300 - overlap); ours start from the unrounded 1.754e8.
    assert flops_per_token(GPT2Config(), 300, overlap) == pytest.approx(paper, rel=0.005)
    assert f"{flops_per_token(GPT2Config(), 300, 0):.2e}" == "1.75e+08"


@pytest.mark.parametrize("window", [200, 300, 600])
def test_recurrence_adds_under_one_percent(window):
    baseline = flops_per_token(GPT2Config(), window, 0)
    recurrent = flops_per_token(RecurrentGPT2Config(window_size=window), window, 0)
    assert baseline < recurrent < 1.01 * baseline


@pytest.mark.parametrize(("window", "overlap"), [(300, 50), (300, 200), (64, 32), (16, 15)])
def test_overlap_costs_the_recomputed_fraction(window, overlap):
    for config in (GPT2Config(), RecurrentGPT2Config(window_size=window, n_positions=1024)):
        ratio = flops_per_token(config, window, overlap) / flops_per_token(config, window, 0)
        assert ratio == pytest.approx(window / (window - overlap), rel=1e-3)


@pytest.mark.parametrize(("window", "overlap", "named"), [(0, 0, "window_size=0"), (8, 8, "overlap=8")])
def test_bad_schedule_raises(window, overlap, named):
    with pytest.raises(ValueError, match=named):
        flops_per_token(GPT2Config(), window, overlap)


# SmolLM2-135M's shape: 30 layers, d = 576, 9 query heads sharing 3 key-value heads of 64, SwiGLU width 1536.
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
}


def test_llama_counts_grouped_query_attention_and_swiglu():
    # By hand: per layer q, o (576 x 576), k, v (576 x 192), gate, up, down (576 x 1536); attention over T = 128.
    weights = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert flops_per_token(LlamaConfig(**SMOLLM2_SHAPE), 128, 0) == 2 * weights + 2 * 30 * 128 * 576 == 216_760_320


def test_llama_recurrence_adds_under_one_percent_and_overlap_the_recomputed_fraction():
    llama = LlamaConfig(**SMOLLM2_SHAPE)
    recurrent = RecurrentLlamaConfig(**SMOLLM2_SHAPE, window_size=128)
    assert flops_per_token(llama, 128, 0) < flops_per_token(recurrent, 128, 0) < 1.01 * flops_per_token(llama, 128, 0)
    assert flops_per_token(llama, 128, 16) == pytest.approx(flops_per_token(llama, 128, 0) * 128 / 112)


def test_memory_slots_and_reading_layers_count_by_hand():
    # SmolLM2's shape, T = 128: 4 attention slots of the final layer, read at 3 layers, against the paper's one slot.
    paper = RecurrentLlamaConfig(**SMOLLM2_SHAPE, window_size=128, recurrence_hidden_sizes=[200])
    memory = RecurrentLlamaConfig(
        **SMOLLM2_SHAPE,
        window_size=128,
        recurrence_hidden_sizes=[200],
        memory_slots=4,
        memory_pooling="attention",
        memory_source="last_layer",
        memory_read_layers=[0, 2, 29],
    )
    network = 2 * 2 * 576 * 200
    # Per position: pooling one layer instead of 30, 4 keys at 3 layers instead of 1, scores and sums of 4 slots;
    # per window: the network and 3 key/value projections (576 x 192 each) for every slot.
    per_position = 2 * 576 - 2 * 30 * 576 + (4 * 3 - 1) * 2 * 576 + 4 * 4 * 576
    per_window = 4 * (network + 3 * 2 * 2 * 576 * 192) - (network + 2 * 2 * 576 * 192)
    expected = flops_per_token(paper, 128, 0) + per_position + per_window / 128
    assert flops_per_token(memory, 128, 0) == pytest.approx(expected, rel=1e-12)
    assert flops_per_token(memory, 128, 0) < 1.01 * flops_per_token(LlamaConfig(**SMOLLM2_SHAPE), 128, 0)


@pytest.mark.parametrize(
    "config",
    [
        Qwen2Config(**SMOLLM2_SHAPE),
        MistralConfig(**SMOLLM2_SHAPE, sliding_window=None),
        Phi3Config(**SMOLLM2_SHAPE),  # fused qkv and gate-up projections: the same weights
        Olmo2Config(**SMOLLM2_SHAPE),
        Qwen3Config(**SMOLLM2_SHAPE, head_dim=64),
        SmolLM3Config(**SMOLLM2_SHAPE),
    ],
    ids=lambda config: config.model_type,
)
def test_every_llama_shaped_backbone_counts_as_llama(config):
    # Every backbone the recurrence core runs over has a count, not only those the count was first written for.
    assert flops_per_token(config, 128, 0) == flops_per_token(LlamaConfig(**SMOLLM2_SHAPE), 128, 0) == 216_760_320
    recurrent = RecurrentDecoderConfig(text_config=config.to_dict(), window_size=128)
    assert (
        flops_per_token(config, 128, 0) < flops_per_token(recurrent, 128, 0) < 1.01 * flops_per_token(config, 128, 0)
    )


def test_mistral_counts_its_sliding_window_on_every_layer():
    weights = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    config = MistralConfig(**SMOLLM2_SHAPE, sliding_window=64)
    assert flops_per_token(config, 128, 0) == 2 * weights + 2 * 30 * 64 * 576


def test_other_model_types_are_refused():
    with pytest.raises(ValueError, match="model_type='bert'"):
        flops_per_token(BertConfig(), 16, 0)


# Gemma 3 270M's shape: 18 layers, d = 640, 4 query heads and 1 key-value head of 256 (queries wider than d), gated MLP
# width 2048, a 512-token sliding window on every layer but 5, 11 and 17.
GEMMA3_270M_SHAPE = {
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
}


def test_gemma3_counts_wide_queries_and_sliding_window_layers():
    config = Gemma3TextConfig(**GEMMA3_270M_SHAPE)
    assert config.layer_types.count("full_attention") == 3
    # By hand: per layer q, o (640 x 1024), k, v (640 x 256), gate, up, down (640 x 2048).
    weights = 18 * (2 * 640 * 1024 + 2 * 640 * 256 + 3 * 640 * 2048)
    # T = 128 lies inside the sliding window: every layer attends to the whole window.
    assert flops_per_token(config, 128, 0) == 2 * weights + 2 * 18 * 128 * 1024 == 205_258_752
    # T = 1024: the 15 sliding-window layers attend to 512 keys, the 3 full-attention layers to 1024.
    assert flops_per_token(config, 1024, 0) == 2 * weights + 2 * (15 * 512 + 3 * 1024) * 1024 == 222_560_256


def test_gemma3_recurrence_adds_under_one_percent():
    stock = Gemma3TextConfig(**GEMMA3_270M_SHAPE)
    recurrent = RecurrentDecoderConfig(text_config=Gemma3TextConfig(**GEMMA3_270M_SHAPE), window_size=128)
    assert flops_per_token(stock, 128, 0) < flops_per_token(recurrent, 128, 0) < 1.01 * flops_per_token(stock, 128, 0)


def test_a_selecting_memory_adds_a_score_and_a_softmax_share_per_position():
    # The same 4 slots pooled by the mean of the layer mix or kept by a selection: the selection scores every
    # position and sums its states into the softmax share (2 x 576 each); slots and reading layers cost alike.
    mean = RecurrentLlamaConfig(**SMOLLM2_SHAPE, window_size=128, memory_slots=4)
    select = RecurrentLlamaConfig(**SMOLLM2_SHAPE, window_size=128, memory_slots=4, memory_pooling="select")
    assert flops_per_token(select, 128, 16) - flops_per_token(mean, 128, 16) == pytest.approx(4 * 576 * 128 / 112)
