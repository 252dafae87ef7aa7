import math

import pytest
import torch

from acare_ray.training.loss import lce_loss


def _group(positive: float, negatives: list[float]) -> torch.Tensor:
    return torch.tensor([positive, *negatives], dtype=torch.float32)


def test_positive_probability_and_loss_for_one_clear_winner():
    scores = _group(2.0, [0.0] * 7)
    p_pos = torch.softmax(scores / 0.5, dim=0)[0].item()
    assert p_pos == pytest.approx(math.exp(4) / (math.exp(4) + 7))
    assert p_pos == pytest.approx(0.89, abs=0.005)
    assert lce_loss(scores, group_size=8, temperature=0.5).item() == pytest.approx(-math.log(p_pos))


def test_a_negative_as_strong_as_the_positive_halves_its_probability():
    scores = _group(2.0, [2.0] + [0.0] * 6)
    p_pos = math.exp(4) / (2 * math.exp(4) + 6)
    assert p_pos == pytest.approx(0.474, abs=0.001)
    assert lce_loss(scores, temperature=0.5).item() == pytest.approx(-math.log(p_pos))


def test_loss_equals_hand_computed_softmax_averaged_over_groups():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 8, generator=generator) * 3
    temperature = 0.3
    expected = 0.0
    for row in scores.tolist():
        exps = [math.exp(s / temperature) for s in row]
        expected += -math.log(exps[0] / sum(exps))
    expected /= len(scores)
    assert lce_loss(scores, group_size=8, temperature=temperature).item() == pytest.approx(
        expected, rel=1e-5
    )


def test_flat_and_grouped_layouts_give_the_same_loss():
    scores = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    assert lce_loss(scores.flatten(), group_size=4).item() == pytest.approx(
        lce_loss(scores, group_size=4).item()
    )


def test_lower_temperature_sharpens_a_correct_ranking():
    scores = _group(1.0, [0.0] * 7)
    assert lce_loss(scores, temperature=0.3) < lce_loss(scores, temperature=0.5)
    assert lce_loss(scores, temperature=0.5) < lce_loss(scores, temperature=1.0)


def test_bf16_scores_are_upcast_to_float32():
    scores = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    loss = lce_loss(scores)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(lce_loss(scores.float()).item(), rel=1e-6)


def test_gradient_pushes_positive_up_and_negatives_down():
    scores = torch.zeros(2, 8, requires_grad=True)
    lce_loss(scores).backward()
    grad = scores.grad
    assert grad is not None
    assert (grad[:, 0] < 0).all()
    assert (grad[:, 1:] > 0).all()
    # d loss / d score sums to zero within each group (softmax minus one-hot, scaled).
    assert torch.allclose(grad.sum(dim=1), torch.zeros(2), atol=1e-7)


def test_gradient_reaches_bf16_leaf():
    scores = torch.randn(2, 8).to(torch.bfloat16).requires_grad_()
    lce_loss(scores).backward()
    assert scores.grad is not None and scores.grad.dtype == torch.bfloat16
    assert scores.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("scores", "group_size", "message"),
    [
        (torch.zeros(10), 8, "10 elements"),
        (torch.zeros(0), 8, "0 elements"),
        (torch.zeros(2, 7), 8, r"shape \(2, 7\)"),
        (torch.zeros(0, 8), 8, r"shape \(0, 8\)"),
        (torch.zeros(2, 2, 8), 8, "1-D or 2-D"),
        (torch.zeros(8), 1, "group_size"),
    ],
)
def test_bad_shapes_raise_a_clear_error(scores, group_size, message):
    with pytest.raises(ValueError, match=message):
        lce_loss(scores, group_size=group_size)


def test_integer_scores_and_bad_temperature_are_rejected():
    with pytest.raises(TypeError, match="floating-point"):
        lce_loss(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        lce_loss(torch.zeros(8), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        lce_loss(torch.zeros(8), temperature=-1.0)
