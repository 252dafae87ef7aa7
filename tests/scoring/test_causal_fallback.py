"""The safe causal backend: load-time checks of the fast path's assumptions and the exact fallback
through the model's own forward (acare_ray/scoring/causal/load.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from scoring_support import CONTEXT, DOCUMENTS
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3

from acare_ray.scoring import AgentContext, Mode, Scorer
from acare_ray.scoring.causal.load import build_causal_module, check_fast_path
from acare_ray.scoring.reference import reference_scores
from acare_ray.testing import TINY_QWEN3, build_random_qwen3, model_config_path

LOGGER = "acare_ray.scoring.causal.load"
# Lengths from one token to several hundred, so batches mix very different widths.
VARIED = [
    "x",
    "Ostrava is the capital of Velmoria.",
    "Velmoria census figures, district by district: " + "north 1,204 south 998 " * 40,
    "A capital.",
    "The capital of Zandor counts 300,000 inhabitants. " * 25,
]


@pytest.fixture(scope="module")
def fallback_scorer(tiny_qwen3_dir):
    return Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", causal_path="fallback")


def test_the_tiny_qwen3_takes_the_fast_path(tiny_scorer, fallback_scorer):
    assert tiny_scorer.backend.path == "fast" and tiny_scorer.backend.path_reasons == []
    assert fallback_scorer.backend.path == "fallback"
    assert fallback_scorer.backend.path_reasons == ["forced by causal_path='fallback'"]


@pytest.mark.parametrize("name", ["Qwen3-Reranker-0.6B", "Qwen3-0.6B", "Qwen3-Embedding-4B"])
def test_real_qwen3_configs_fit_the_fast_path(name):
    """The real models' layouts (heads, head_dim, rope, window fields) pass every check and
    the probe; only the depth, vocabulary and MLP width are shrunk to keep the test small."""
    import json

    fields = json.loads(model_config_path(name).read_text())
    fields = {
        k: v
        for k, v in fields.items()
        if k not in ("architectures", "torch_dtype", "transformers_version")
    }
    fields |= dict(num_hidden_layers=1, vocab_size=1000, intermediate_size=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**fields)).float().eval()
    assert check_fast_path(model) == []
    module, reasons = build_causal_module(model, 5, 7, "cpu")
    assert module.path == "fast" and reasons == []


@pytest.fixture(scope="module")
def scorers(tiny_qwen3_dir, tiny_scorer, fallback_scorer):
    """Both paths, with the default token budget (one batch) and a small one (many batches)."""
    small = {
        path: Scorer.from_pretrained(
            str(tiny_qwen3_dir), device="cpu", causal_path=path, max_batch_tokens=200
        )
        for path in ("fast", "fallback")
    }
    return [tiny_scorer, fallback_scorer, small["fast"], small["fallback"]]


@pytest.mark.parametrize("mode", list(Mode))
def test_both_paths_equal_the_naive_recipe(scorers, naive_reference, mode):
    assert [s.backend.path for s in scorers] == ["fast", "fallback"] * 2
    for scorer in scorers:
        np.testing.assert_allclose(
            scorer.score(CONTEXT, DOCUMENTS, mode), naive_reference[mode], atol=1e-4, rtol=0
        )


def test_documents_of_very_different_lengths(tiny_qwen3_dir, scorers):
    lengths = [len(scorers[0].backend.encoder.document_ids([d], [10_000])[0]) for d in VARIED]
    assert min(lengths) <= 2 and max(lengths) >= 300
    texts = [scorers[0].render(CONTEXT, d, Mode.M3) for d in VARIED]
    want = reference_scores(tiny_qwen3_dir, texts)
    for scorer in scorers:
        got = scorer.score(CONTEXT, VARIED, Mode.M3)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", list(Mode))
def test_fallback_shared_prefix_equals_each_pair_alone(fallback_scorer, mode):
    batched = fallback_scorer.score(CONTEXT, DOCUMENTS, mode)
    alone = np.array([fallback_scorer.score(CONTEXT, [d], mode)[0] for d in DOCUMENTS])
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)


def test_fallback_packed_searches_and_training_forward(tiny_qwen3_dir, fallback_scorer):
    """Several prefixes at once (pack_searches, the training forward with doc_group) give the
    scores of one search at a time, and gradients flow through the fallback."""
    packed = Scorer.from_pretrained(
        str(tiny_qwen3_dir), device="cpu", causal_path="fallback", pack_searches=True
    )
    other = AgentContext("Velmoria capital")
    items = [(CONTEXT, DOCUMENTS[:3]), (other, DOCUMENTS[3:]), (CONTEXT, []), (other, VARIED)]
    got = packed.score_many(items, mode="auto")
    want = fallback_scorer.score_many(items, mode="auto")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)

    encoder, module = packed.backend.encoder, packed.backend.module
    prefixes = [encoder.prefix_ids(CONTEXT, Mode.M3), encoder.prefix_ids(other, Mode.M0)]
    prefix_ids = torch.zeros(2, max(map(len, prefixes)), dtype=torch.long)
    prefix_mask = torch.zeros_like(prefix_ids, dtype=torch.bool)
    for i, p in enumerate(prefixes):
        prefix_ids[i, : len(p)], prefix_mask[i, : len(p)] = torch.tensor(p), True
    seqs = [d + encoder.suffix_ids for d in encoder.document_ids(DOCUMENTS[:3] * 2, [1000] * 6)]
    ids = torch.zeros(6, max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    group = torch.tensor([1, 0, 1, 0, 1, 0])  # interleaved: scores come back in row order
    module.zero_grad()
    scores = module(prefix_ids, prefix_mask, ids, lengths, group)
    scores.sum().backward()
    assert module.lm.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    module.zero_grad()
    expected = {
        0: fallback_scorer.score(CONTEXT, DOCUMENTS[:3], Mode.M3),
        1: fallback_scorer.score(other, DOCUMENTS[:3], Mode.M0),
    }
    want = [expected[int(g)][i % 3] for i, g in enumerate(group)]
    np.testing.assert_allclose(scores.detach().numpy(), want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def sliding_dir(tmp_path_factory):
    """The tiny Qwen3 (same weights) with a 16-token window in its second layer: a hybrid
    layout the fast path cannot run, and a window short enough to change every score."""
    return build_random_qwen3(
        tmp_path_factory.mktemp("sliding") / "model",
        use_sliding_window=True,
        sliding_window=16,
        layer_types=["full_attention", "sliding_attention"],
    )


def test_sliding_window_layers_take_the_fallback_and_stay_exact(sliding_dir, tiny_scorer, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        scorer = Scorer.from_pretrained(str(sliding_dir), device="cpu", max_batch_tokens=200)
    assert scorer.backend.path == "fallback"
    reasons = " | ".join(scorer.backend.path_reasons)
    assert "layer_types has sliding_attention" in reasons and "sliding_window=16" in reasons
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1 and "falling back" in warned[0]
    assert "sliding_attention" in warned[0] and "use_sliding_window=True" in warned[0]
    for mode in (Mode.M0, Mode.M3):
        texts = [scorer.render(CONTEXT, d, mode) for d in DOCUMENTS]
        want = reference_scores(sliding_dir, texts)
        got = scorer.score(CONTEXT, DOCUMENTS, mode)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
        # the window binds: the same weights without it score differently
        assert np.abs(want - tiny_scorer.score(CONTEXT, DOCUMENTS, mode)).max() > 1e-2
    alone = np.array([scorer.score(CONTEXT, [d], Mode.M3)[0] for d in DOCUMENTS])
    np.testing.assert_allclose(alone, got, atol=1e-5, rtol=0)


def test_forcing_the_fast_path_on_an_unsupported_layout_fails_clearly(sliding_dir):
    with pytest.raises(ValueError, match=r"causal_path='fast'.*sliding_attention"):
        Scorer.from_pretrained(str(sliding_dir), device="cpu", causal_path="fast")
    with pytest.raises(ValueError, match="causal_path must be one of auto, fast, fallback"):
        Scorer.from_pretrained(str(sliding_dir), device="cpu", causal_path="quick")


@pytest.fixture
def extra_norm_layer(monkeypatch):
    """A transformers release whose decoder layer gains a module (a post-MLP norm, as in
    Gemma 2) that the fast path does not know it must run."""
    layer_cls = modeling_qwen3.Qwen3DecoderLayer
    init, forward = layer_cls.__init__, layer_cls.forward

    def patched_init(self, config, layer_idx):
        init(self, config, layer_idx)
        self.post_feedforward_layernorm = modeling_qwen3.Qwen3RMSNorm(config.hidden_size)
        with torch.no_grad():
            self.post_feedforward_layernorm.weight.fill_(0.5)

    def patched_forward(self, hidden_states, *args, **kwargs):
        out = forward(self, hidden_states, *args, **kwargs)
        return self.post_feedforward_layernorm(out)

    monkeypatch.setattr(layer_cls, "__init__", patched_init)
    monkeypatch.setattr(layer_cls, "forward", patched_forward)


def test_a_layer_with_an_unknown_module_takes_the_fallback(
    tiny_qwen3_dir, extra_norm_layer, caplog
):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")
    assert scorer.backend.path == "fallback"
    assert scorer.backend.path_reasons == [
        "layer 0: Qwen3DecoderLayer has modules the fast path does not run: "
        "post_feedforward_layernorm"
    ]
    assert any("post_feedforward_layernorm" in r.getMessage() for r in caplog.records)
    texts = [scorer.render(CONTEXT, d, Mode.M2) for d in DOCUMENTS]
    np.testing.assert_allclose(
        scorer.score(CONTEXT, DOCUMENTS, Mode.M2),
        reference_scores(tiny_qwen3_dir, texts),
        atol=1e-4,
    )


def test_a_drift_no_structural_check_names_is_caught_by_the_probe(
    tiny_qwen3_dir, monkeypatch, caplog
):
    """The attention's own forward changes (here: its output halved) with every name intact."""
    attention_cls = modeling_qwen3.Qwen3Attention
    forward = attention_cls.forward

    def halved(self, *args, **kwargs):
        out, weights = forward(self, *args, **kwargs)
        return out * 0.5, weights

    monkeypatch.setattr(attention_cls, "forward", halved)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")
    assert scorer.backend.path == "fallback"
    assert len(scorer.backend.path_reasons) == 1
    assert "disagrees with the model's own forward" in scorer.backend.path_reasons[0]
    assert any("disagrees" in r.getMessage() for r in caplog.records)
    texts = [scorer.render(CONTEXT, d, Mode.M1) for d in DOCUMENTS]
    np.testing.assert_allclose(
        scorer.score(CONTEXT, DOCUMENTS, Mode.M1),
        reference_scores(tiny_qwen3_dir, texts),
        atol=1e-4,
    )


def _tiny_model(**overrides) -> Qwen3ForCausalLM:
    fields = dict(TINY_QWEN3, vocab_size=1000) | overrides
    return Qwen3ForCausalLM(Qwen3Config(**fields)).eval()


def test_check_names_missing_attributes_renames_and_model_types():
    model = _tiny_model()
    del model.model.layers[1].self_attn.scaling
    model.model.layers[0].self_attn.out_proj = model.model.layers[0].self_attn.o_proj
    del model.model.layers[0].self_attn.o_proj
    reasons = check_fast_path(model)
    assert "layer 0: Qwen3Attention lacks o_proj" in reasons
    assert "layer 0: Qwen3Attention has modules the fast path does not run: out_proj" in reasons
    assert "layer 1: Qwen3Attention has no float scaling" in reasons

    other = _tiny_model()
    other.config.model_type = "gemma2"
    other.config.final_logit_softcapping = 30.0
    other.config._attn_implementation = "my_kernel"
    reasons = check_fast_path(other)
    assert any("model_type 'gemma2'" in r for r in reasons)
    assert any("final_logit_softcapping=30.0" in r for r in reasons)
    assert any("'my_kernel'" in r for r in reasons)


def test_check_names_rotary_changes(monkeypatch):
    model = _tiny_model()
    rotary = model.model.rotary_emb
    monkeypatch.setattr(rotary, "forward", lambda x, position_ids, extra: None)
    assert check_fast_path(model)[0].startswith("rotary_emb(x, position_ids) fails: TypeError")

    monkeypatch.setattr(rotary, "forward", lambda x, position_ids: torch.ones(1, 5, 16))
    assert check_fast_path(model) == ["rotary_emb(x, position_ids) returns Tensor, not (cos, sin)"]

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # a GPT-J style rotation
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        pairs = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)
        return q * cos + pairs * sin, k

    monkeypatch.undo()
    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", interleaved)
    assert check_fast_path(model) == [
        "the model's apply_rotary_pos_emb differs from the fast path's rotate-half RoPE"
    ]


def test_mistral_window_without_use_sliding_window_is_named():
    from transformers import MistralConfig

    config = MistralConfig(**TINY_QWEN3, vocab_size=1000, sliding_window=4096)
    model = AutoModelForCausalLM.from_config(config)
    reasons = check_fast_path(model)
    assert any("sliding_window=4096 without use_sliding_window" in r for r in reasons)
