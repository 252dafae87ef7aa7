"""The recorded scores of the scoring core (``benchmarks/score_identity.py``) as a test: every
path (causal fast, fallback, packed, small batches; the MiniLM cross-encoder) still gives the
scores committed in ``benchmarks/results/score-identity-before.json`` for the same fixed inputs
(every mode, truncated documents, text spelling control tokens, an empty search, a custom
instruction). The benchmark compares bit for bit on one machine; here the tolerance is float32
rounding, so a different CPU's kernels pass and a changed score does not."""

from __future__ import annotations

import json

import numpy as np
import pytest
from benchmarks_import import BENCHMARKS, benchmark_modules

RECORD = BENCHMARKS / "results" / "score-identity-before.json"


def _floats(bits: list[str]) -> np.ndarray:
    return np.array([int(b, 16) for b in bits], dtype=np.uint32).view(np.float32)


@pytest.mark.slow
def test_every_scoring_path_still_gives_the_recorded_scores():
    with benchmark_modules("score_identity") as (score_identity,):
        now = score_identity.collect()
    recorded = json.loads(RECORD.read_text())
    assert now.keys() == recorded.keys()
    assert sum(len(v) for v in recorded.values()) >= 250
    for key, bits in recorded.items():
        np.testing.assert_allclose(
            _floats(now[key]), _floats(bits), rtol=1e-5, atol=1e-5, err_msg=key
        )
