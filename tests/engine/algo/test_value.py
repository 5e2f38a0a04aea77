import pytest
import torch

from engine.algo.aggregate import LossScale
from engine.algo.value import value_loss
from engine.config import CriticConfig

# ε = 0.2. Per token (old, v, R):
#   a: (1.0, 1.1, 2.0)  |v − old| ≤ ε: v_clip = v;  ½·0.9² = 0.405               not clipped
#   b: (1.0, 1.5, 2.0)  v_clip = 1.2; (v−R)² = 0.25 < (v_clip−R)² = 0.64 → 0.32   clipped
#   c: (1.0, 1.5, 0.0)  v_clip = 1.2; (v−R)² = 2.25 > (v_clip−R)² = 1.44 → 1.125  not clipped
#   d: (1.0, 0.5, 0.0)  v_clip = 0.8; (v−R)² = 0.25 < (v_clip−R)² = 0.64 → 0.32   clipped
#   padding: (0, 100, −100), must not count
OLD = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
VALUES = torch.tensor([[1.1, 1.5, 1.5], [0.5, 100.0, 100.0]])
RETURNS = torch.tensor([[2.0, 2.0, 0.0], [0.0, -100.0, -100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
PER_TOKEN = [0.405, 0.32, 1.125, 0.32]  # Σ = 2.17


def cfg(mode: str = "token-mean") -> CriticConfig:
    return CriticConfig(cliprange_value=0.2, loss_agg_mode=mode)


def test_hand_computed_token_mean():
    loss, metrics = value_loss(VALUES, OLD, RETURNS, MASK, cfg(), None)
    assert loss.item() == pytest.approx(sum(PER_TOKEN) / 4)  # 0.5425
    assert metrics["critic/vf_loss"] == pytest.approx(0.5425)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.5)  # b and d of 4 tokens
    assert metrics["critic/vpred_mean"] == pytest.approx((1.1 + 1.5 + 1.5 + 0.5) / 4)


def test_aggregation_mode_and_scale_are_honoured():
    loss, _ = value_loss(VALUES, OLD, RETURNS, MASK, cfg("token-sum"), None)
    assert loss.item() == pytest.approx(2.17)
    # seq-mean-token-mean: row means (0.405+0.32+1.125)/3 = 0.61667 and 0.32 → 0.46833
    loss, _ = value_loss(VALUES, OLD, RETURNS, MASK, cfg("seq-mean-token-mean"), None)
    assert loss.item() == pytest.approx((1.85 / 3 + 0.32) / 2)
    loss, _ = value_loss(VALUES, OLD, RETURNS, MASK, cfg(), LossScale(num_tokens=8, num_seqs=4))
    assert loss.item() == pytest.approx(2.17 / 8)


def test_no_clipping_when_values_stay_within_the_range():
    values = OLD + 0.1
    loss, metrics = value_loss(values, OLD, RETURNS, MASK, cfg(), None)
    expected = 0.5 * ((values - RETURNS) ** 2 * MASK).sum() / 4
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["critic/vf_clipfrac"] == 0.0


def test_gradient_is_zero_where_the_clipped_term_is_larger():
    values = VALUES.clone().requires_grad_(True)
    loss, _ = value_loss(values, OLD, RETURNS, MASK, cfg("token-sum"), None)
    loss.backward()
    # unclipped active: ∂(½(v−R)²)/∂v = v − R; a: 1.1 − 2 = −0.9, c: 1.5 − 0 = 1.5
    # clipped active (b, d) and padding: 0
    expected = torch.tensor([[-0.9, 0.0, 1.5], [0.0, 0.0, 0.0]])
    assert torch.allclose(values.grad, expected, atol=1e-6)


def test_cliprange_is_read_from_config():
    # with ε = 1, token b is no longer clipped: ½·0.25 = 0.125 instead of 0.32
    wide = CriticConfig(cliprange_value=1.0, loss_agg_mode="token-sum")
    loss, metrics = value_loss(VALUES, OLD, RETURNS, MASK, wide, None)
    assert loss.item() == pytest.approx(0.405 + 0.125 + 1.125 + 0.125)
    assert metrics["critic/vf_clipfrac"] == 0.0
