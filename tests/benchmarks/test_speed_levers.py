"""The speed levers kept in the core give the scores of the plain path they replace."""

import copy

import numpy as np
import pytest
import torch

from acare_ray.scoring import AgentContext, Mode
from acare_ray.scoring.batching import pad_right
from acare_ray.scoring.causal import fast as fast_path

CONTEXT = AgentContext(
    "capital population",
    question="What is the population of the capital of the country where Anna Berg was born? " * 3,
    reasoning="Anna Berg was born in Velmoria, so I need its capital and that city's population. "
    * 4,
)
DOCUMENTS = [
    "Ostrava is the capital of Velmoria.",
    "Paris is the capital of France and has about two million inhabitants in the city proper.",
    "short",
    "Population statistics for capitals in Europe vary widely. " * 5,
]


def _batch(tiny_scorer, documents):
    encoder = tiny_scorer.backend.encoder
    prefix = torch.tensor([encoder.prefix_ids(CONTEXT, Mode.M3)])
    seqs = [
        d + encoder.suffix_ids for d in encoder.document_ids(documents, [4096] * len(documents))
    ]
    ids, lengths = pad_right(seqs)
    return prefix, ids, lengths


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 0.05)])
def test_split_prefix_attention_equals_concatenation(tiny_scorer, monkeypatch, dtype, atol):
    """bfloat16 pins a bug: the float32 log-sum-exp weights must take the outputs' dtype."""
    module = copy.deepcopy(tiny_scorer.backend.module).to(dtype)
    prefix, ids, lengths = _batch(tiny_scorer, DOCUMENTS)
    assert prefix.shape[1] >= ids.shape[1], "the fixture must take the split path"
    taken = []
    split = fast_path._attend_shared_prefix

    def spy(*args, **kwargs):
        taken.append(True)
        return split(*args, **kwargs)

    monkeypatch.setattr(fast_path, "_attend_shared_prefix", spy)
    with torch.inference_mode():
        state = module.encode_prefixes(prefix, torch.ones_like(prefix, dtype=torch.bool))
        fast = module.score_documents(state, ids, lengths)
    assert taken
    monkeypatch.setattr(fast_path, "_CPU_FLASH", None)
    with torch.inference_mode():
        plain = module.score_documents(state, ids, lengths)
    fast, plain = fast.float().numpy(), plain.float().numpy()
    np.testing.assert_allclose(fast, plain, atol=atol, rtol=0)
    assert np.ptp(plain) > 0.01


@pytest.mark.parametrize("budget", [1, 100, 100_000])
def test_split_path_equals_the_full_forward_of_each_prompt(tiny_qwen3_dir, budget):
    from transformers import AutoTokenizer

    from acare_ray.scoring import Scorer

    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), max_batch_tokens=budget)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    model, encoder = scorer.backend.module.lm, scorer.backend.encoder
    expected = []
    with torch.inference_mode():
        for doc in DOCUMENTS:
            ids = tokenizer(scorer.render(CONTEXT, doc, Mode.M3), return_tensors="pt")
            logits = model(**ids).logits[0, -1]
            expected.append(float(logits[encoder.yes_id] - logits[encoder.no_id]))
    np.testing.assert_allclose(scorer.score(CONTEXT, DOCUMENTS, Mode.M3), expected, atol=1e-4)


@pytest.mark.slow
def test_compiled_layers_score_like_eager(tiny_qwen3_dir, tiny_scorer):
    from acare_ray.scoring import Scorer

    compiled = Scorer.from_pretrained(str(tiny_qwen3_dir), compile=True)
    assert compiled.backend.module.compiled
    for mode in (Mode.M0, Mode.M3):
        np.testing.assert_allclose(
            compiled.score(CONTEXT, DOCUMENTS, mode),
            tiny_scorer.score(CONTEXT, DOCUMENTS, mode),
            atol=1e-5,
        )


def _scores(module, prefix, ids, lengths):
    with torch.inference_mode():
        state = module.encode_prefixes(prefix, torch.ones_like(prefix, dtype=torch.bool))
        return module.score_documents(state, ids, lengths).float().numpy()


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 0.05)])
def test_the_cuda_split_route_equals_concatenation_on_cpu(tiny_scorer, monkeypatch, dtype, atol):
    """The split path as CUDA runs it (own tokens under the kernel's causal flag, own keys
    repeated per query head, no mask), with the CPU kernel: the same scores as the concatenating
    path, for a prefix longer and one shorter than the candidates (attention="split" takes both)."""
    module = copy.deepcopy(tiny_scorer.backend.module).to(dtype)
    long_prefix, ids, lengths = _batch(tiny_scorer, DOCUMENTS)
    assert lengths.min() < ids.shape[1], "the fixture must pad some candidates"
    short_prefix = long_prefix[:, :8]
    assert short_prefix.shape[1] < ids.shape[1]
    module.attention = "concat"
    plain = [_scores(module, p, ids, lengths) for p in (long_prefix, short_prefix)]
    built = []
    monkeypatch.setattr(
        fast_path._SplitMask, "build", classmethod(lambda cls, *a: built.append(1) or cls(None))
    )
    module.attention = "split"
    split = [_scores(module, p, ids, lengths) for p in (long_prefix, short_prefix)]
    assert len(built) == 2
    for got, want in zip(split, plain):
        np.testing.assert_allclose(got, want, atol=atol, rtol=0)
        assert np.ptp(want) > 0.01


def test_compile_is_on_by_default_on_cuda_only(tiny_scorer):
    from acare_ray.scoring.causal.load import compile_wanted

    assert compile_wanted(None, torch.device("cuda")) is True
    assert compile_wanted(None, torch.device("cpu")) is False
    assert compile_wanted(True, torch.device("cpu")) is True
    assert compile_wanted(False, torch.device("cuda")) is False
    assert tiny_scorer.config.compile is None and not tiny_scorer.backend.module.compiled
