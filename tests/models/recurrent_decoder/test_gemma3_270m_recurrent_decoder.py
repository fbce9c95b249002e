"""The recurrence core over a real pretrained decoder: Gemma 3 270M base (18 layers, one key-value head of width 256,
a 512-token sliding window on 5 of 6 layers, two RoPE bases, scaled embeddings, a 262,144-token vocabulary),
de-quantised from its offline GGUF. Slow (about three minutes on two CPU cores), and skipped where the package is not
installed."""

import pytest
import torch

from hf_recurrence import RecurrentDecoderForCausalLM
from hf_recurrence.gemma3 import gemma3_270m_gguf_path, load_gemma3_270m

from ...common import installed_or_skip


@pytest.mark.slow
def test_gemma3_270m_checkpoint_runs_with_the_recurrence(tmp_path):
    stock = load_gemma3_270m(installed_or_skip(gemma3_270m_gguf_path).parent).eval()
    stock.save_pretrained(tmp_path / "stock")
    model, info = RecurrentDecoderForCausalLM.from_pretrained(
        tmp_path / "stock", window_size=64, window_overlap=8, insertion_layer=2, output_loading_info=True
    )
    model.eval()
    assert info["unexpected_keys"] == set()
    assert info["missing_keys"] and all(key.startswith("recurrence.") for key in info["missing_keys"])
    ids = torch.randint(10, 50_000, (1, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(ids).logits
        # The first window is the stock model's computation (measured bit-identical).
        torch.testing.assert_close(whole[:, :64], stock(ids[:, :64]).logits, rtol=1e-6, atol=1e-5)
        first = model(ids[:, :50])
        rest = model(ids[:, 50:], past_key_values=first.past_key_values)
        # 18 layers and logits of magnitude ~100 in float32: measured 1.8e-4 apart at most.
        torch.testing.assert_close(torch.cat([first.logits, rest.logits], dim=1), whole, rtol=1e-5, atol=1e-3)
    generated = model.generate(ids[:, :60], attention_mask=torch.ones_like(ids[:, :60]), max_new_tokens=10)
    assert generated.shape == (1, 70)
