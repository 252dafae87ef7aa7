"""The optimisation step: its loss is loss.py's, accumulation, schedule, weight-decay groups."""

from __future__ import annotations

import pytest
import torch

from acare_ray.data.synthetic import synthetic_groups
from acare_ray.scoring import FieldDropout, Scorer
from acare_ray.training.collator import GroupCollator
from acare_ray.training.groups import parse_groups
from acare_ray.training.loop import (
    WeightAverage,
    build_optimizer,
    train_step,
    trainable_module,
    use_cpu_bf16,
    warmup_linear,
)
from acare_ray.training.loss import lce_loss

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def groups():
    return parse_groups(synthetic_groups(4, seed=9), 8)


def _fresh(path):
    scorer = Scorer.from_pretrained(str(path), device="cpu")
    collator = GroupCollator(scorer.backend, 8, FieldDropout(0.5, 0.5, seed=0))
    return scorer, trainable_module(scorer), collator


@pytest.mark.parametrize("temperature", [0.5, 0.3])
def test_loop_loss_equals_lce_loss_on_the_same_scores(tiny_qwen3_dir, groups, temperature):
    _, module, collator = _fresh(tiny_qwen3_dir)
    batches = [collator(groups[:2], 0), collator(groups[2:4], 0)]
    with torch.no_grad():
        expected = [
            float(lce_loss(module(*b.inputs()).view(2, 8), 8, temperature)) for b in batches
        ]
    optimizer = build_optimizer(module, 1e-3, 0.0)
    stats = train_step(
        module,
        batches,
        optimizer,
        warmup_linear(optimizer, 0, 10),
        group_size=8,
        temperature=temperature,
        max_grad_norm=None,
        device=CPU,
    )
    assert stats.loss == pytest.approx(sum(expected) / 2, rel=1e-5)
    with torch.no_grad():
        after = float(lce_loss(module(*batches[0].inputs()), 8, temperature))
    assert after != pytest.approx(expected[0], rel=1e-6)  # the step changed the weights


def test_accumulated_micro_batches_update_like_one_batch(tiny_qwen3_dir, groups):
    deltas = []
    for split in ([groups[:2], groups[2:4]], [groups[:4]]):
        _, module, collator = _fresh(tiny_qwen3_dir)
        before = [p.detach().clone() for p in module.parameters()]
        optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
        train_step(
            module,
            [collator(part, 0) for part in split],
            optimizer,
            warmup_linear(optimizer, 0, 10),
            group_size=8,
            temperature=0.5,
            max_grad_norm=None,
            device=CPU,
        )
        deltas.append([p.detach() - b for p, b in zip(module.parameters(), before)])
    moved = sum(float(d.abs().sum()) for d in deltas[1])
    assert moved > 0
    for a, b in zip(*deltas):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_gradient_clipping_bounds_the_update(tiny_qwen3_dir, groups):
    _, module, collator = _fresh(tiny_qwen3_dir)
    before = [p.detach().clone() for p in module.parameters()]
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    stats = train_step(
        module,
        [collator(groups[:2], 0)],
        optimizer,
        warmup_linear(optimizer, 0, 10),
        group_size=8,
        temperature=0.5,
        max_grad_norm=1e-3,
        device=CPU,
    )
    assert stats.grad_norm > 1e-3
    change = torch.sqrt(
        sum(((p.detach() - b) ** 2).sum() for p, b in zip(module.parameters(), before))
    )
    assert float(change) == pytest.approx(1e-3, rel=1e-3)


def test_warmup_then_linear_decay():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = warmup_linear(optimizer, warmup_steps=4, total_steps=12)
    lrs = []
    for _ in range(12):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert lrs[4] == pytest.approx(1.0)
    assert lrs[4:] == sorted(lrs[4:], reverse=True)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)


def test_biases_and_norms_get_no_weight_decay(tiny_scorer):
    module = trainable_module(tiny_scorer)
    optimizer = build_optimizer(module, 1e-3, weight_decay=0.1)
    by_decay = {g["weight_decay"]: g["params"] for g in optimizer.param_groups}
    assert all(p.dim() >= 2 for p in by_decay[0.1])
    assert by_decay[0.0] and all(p.dim() == 1 for p in by_decay[0.0])
    assert sum(len(ps) for ps in by_decay.values()) == len(list(module.parameters()))


def test_weight_average_follows_the_weights_with_a_warming_decay():
    """The average after each update is the hand-computed EMA with the warmed-up decay
    ``min(decay, (1 + n) / (10 + n))``; frozen weights are not averaged; inside ``applied`` the
    module holds the averages and gets its trained weights back on exit."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    module[1].bias.requires_grad_(False)
    average = WeightAverage(module, decay=0.2)
    assert set(average.averages) == {"0.weight", "0.bias", "1.weight"}
    expected = module[0].weight.detach().clone()
    rates = []
    for step in range(4):
        with torch.no_grad():
            for param in module.parameters():
                param.add_(float(step + 1))
        rate = min(0.2, (1 + step) / (10 + step))
        rates.append(average.rate())
        expected = rate * expected + (1 - rate) * module[0].weight.detach()
        average.update(module)
    assert rates == pytest.approx([0.1, 2 / 11, 0.2, 0.2])  # warming up, then capped at decay
    torch.testing.assert_close(average.averages["0.weight"], expected)

    trained = {name: p.detach().clone() for name, p in module.named_parameters()}
    with average.applied(module) as kept:
        torch.testing.assert_close(module[0].weight, average.averages["0.weight"])
        assert not torch.equal(module[0].weight, trained["0.weight"])
        torch.testing.assert_close(kept["0.weight"], trained["0.weight"])
        assert torch.equal(module[1].bias, trained["1.bias"])  # frozen: untouched
    for name, param in module.named_parameters():
        assert torch.equal(param, trained[name]), name


def test_weight_average_refuses_a_decay_outside_0_1():
    with pytest.raises(ValueError, match="decay must be in"):
        WeightAverage(torch.nn.Linear(2, 1), decay=1.0)


def test_cpu_bf16_auto_follows_the_cpus_native_bf16(monkeypatch):
    """``cpu_bf16: auto`` (the recipe's) trains under bf16 autocast only where the CPU has native
    bf16; an explicit true or false is kept whatever the CPU."""
    import acare_ray.training.loop as loop

    for native in (True, False):
        monkeypatch.setattr(loop, "native_cpu_bf16", lambda native=native: native)
        assert use_cpu_bf16("auto") is native
        assert use_cpu_bf16(True) is True and use_cpu_bf16(False) is False
    with pytest.raises(ValueError, match="cpu_bf16 must be true, false or 'auto'"):
        use_cpu_bf16("on")
