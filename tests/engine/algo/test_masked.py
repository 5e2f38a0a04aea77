import math

import pytest
import torch

from engine.algo.masked import masked_mean, masked_sum, masked_var, masked_whiten

INF, NAN = float("inf"), float("nan")

# Valid values 1, 2, 3 | 4; the padding holds garbage, inf and NaN.
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, INF, NAN]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
# mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
VAR_UNBIASED = 5 / 3
STD = math.sqrt(VAR_UNBIASED)  # 1.2909944


def test_masked_sum():
    assert masked_sum(X, MASK).item() == 10.0
    assert masked_sum(X, MASK, dim=-1).tolist() == [6.0, 4.0]
    assert masked_sum(X, MASK, dim=0).tolist() == [5.0, 2.0, 3.0]


def test_masked_mean():
    assert masked_mean(X, MASK).item() == 2.5
    assert masked_mean(X, MASK, dim=-1).tolist() == [2.0, 4.0]


def test_masked_var():
    assert masked_var(X, MASK).item() == pytest.approx(VAR_UNBIASED)  # 5 / (4 − 1)
    assert masked_var(X, MASK, unbiased=False).item() == pytest.approx(1.25)  # 5 / 4


def test_single_element_variance_is_zero():
    mask = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_var(X, mask).item() == 0.0
    assert masked_var(X, mask, unbiased=False).item() == 0.0


def test_masked_whiten():
    # (x − 2.5) / 1.2909944: −1.5, −0.5, 0.5, 1.5 → ±1.1618950, ±0.3872983
    w = masked_whiten(X, MASK)
    expected = torch.tensor([[-1.1618950, -0.3872983, 0.3872983], [1.1618950, 0.0, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    valid = w[MASK.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.var().item() == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_without_shifting_the_mean():
    w = masked_whiten(X, MASK, shift_mean=False)
    expected = torch.tensor([[1.3381050, 2.1127017, 2.8872983], [3.6618950, 0.0, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)


def test_all_masked_gives_zero_not_nan():
    none = torch.zeros_like(MASK)
    assert masked_sum(X, none).item() == 0.0
    assert masked_mean(X, none).item() == 0.0
    assert masked_mean(X, none, dim=-1).tolist() == [0.0, 0.0]
    assert masked_var(X, none).item() == 0.0
    assert masked_whiten(X, none).tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_one_empty_row_gives_zero_for_that_row():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_mean(X, mask, dim=-1).tolist() == [1.5, 0.0]


def test_bool_mask_equals_float_mask():
    b = MASK.bool()
    assert masked_mean(X, b).item() == 2.5
    assert masked_var(X, b).item() == pytest.approx(VAR_UNBIASED)
    assert torch.allclose(masked_whiten(X, b), masked_whiten(X, MASK))


def test_inf_and_nan_in_padding_give_finite_gradients():
    weights = torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 1.0]])
    for fn in (masked_sum, masked_mean, masked_var, masked_whiten):
        x = X.clone().requires_grad_(True)
        out = fn(x, MASK)
        assert torch.isfinite(out).all(), fn.__name__
        loss = (out * weights).sum() if out.dim() else out
        loss.backward()
        assert torch.isfinite(x.grad).all(), fn.__name__
        assert (x.grad[~MASK.bool()] == 0).all(), fn.__name__


def test_last_valid_index_skips_the_holes_of_a_multi_turn_row():
    from engine.algo.masked import last_valid_index

    mask = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 0],  # model, tool, model, padding: the last is index 5
            [1, 1, 1, 0, 0, 0, 0],  # one turn: index 2 (what sum - 1 gave too)
            [0, 0, 0, 0, 0, 0, 0],  # empty: 0
            [1, 0, 0, 0, 0, 0, 1],  # the last position
        ],
        dtype=torch.float32,
    )
    assert last_valid_index(mask).tolist() == [5, 2, 0, 6]
