"""Issue 35: in float32 the fast path's ranks do not move with the batch: the top-10 of every
search is the same with 1, 8 or 64 documents per forward and with searches packed together."""

from __future__ import annotations

import numpy as np
import pytest

from acare_ray.scoring import AgentContext, Scorer

WORDS = [
    "river",
    "city",
    "bridge",
    "tower",
    "museum",
    "harbor",
    "castle",
    "garden",
    "station",
    "market",
]


def _searches(n: int = 6, docs: int = 24) -> list[tuple[AgentContext, list[str]]]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        context = AgentContext(
            f"{WORDS[i]} history",
            question=f"When was the {WORDS[i]} of the old town built?",
            reasoning=" ".join(rng.choice(WORDS, 12)),
        )
        out.append(
            (context, [" ".join(rng.choice(WORDS, int(rng.integers(3, 40)))) for _ in range(docs)])
        )
    return out


def _top10(scores) -> list[int]:
    scores = np.asarray(scores, dtype=np.float64)
    return np.lexsort((np.arange(len(scores)), -scores))[:10].tolist()


@pytest.mark.parametrize(
    "options", [{"max_batch_size": 1}, {"max_batch_size": 8}, {"pack_searches": True}]
)
def test_top10_is_invariant_to_the_batch_in_float32(tiny_qwen3_dir, options):
    items = _searches()
    reference = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", max_batch_size=64)
    other = Scorer.from_pretrained(
        str(tiny_qwen3_dir), device="cpu", **{"max_batch_size": 64, **options}
    )
    want = [reference.score(c, d, "auto") for c, d in items]
    got = (
        other.score_many(items, "auto")
        if options.get("pack_searches")
        else [other.score(c, d, "auto") for c, d in items]
    )
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)
        assert _top10(a) == _top10(b)
