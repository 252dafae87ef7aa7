"""Random-weight models with the real Qwen3 tokenizer, for tests and speed benchmarks.

These machines cannot download weights, so tests build a tiny random Qwen3, save it with
``save_pretrained`` and load it back through the same ``Scorer.from_pretrained`` users run.
The tokenizer and the real models' ``config.json`` files are fixtures of the repository
(``tests/fixtures/``, each folder with a SOURCE.md), so this module needs a source checkout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["build_random_qwen3", "fixture_path", "model_config_path", "qwen3_tokenizer_dir"]

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def fixture_path(*parts: str) -> Path:
    """``tests/fixtures/<parts...>`` of the repository; FileNotFoundError when it is not there."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"test fixture {path} not found: acare_ray.testing needs a source checkout of the "
            "repository (its tests/fixtures folder), not an installed package alone"
        )
    return path


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer (``tests/fixtures/qwen3_tokenizer``)."""
    return fixture_path("qwen3_tokenizer")


def model_config_path(name: str) -> Path:
    """``config.json`` of a real model by folder name, e.g. ``Qwen3-Reranker-0.6B``."""
    return fixture_path("model_configs", name, "config.json")


TINY_QWEN3 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=8192,
    initializer_range=0.1,
)


def build_random_qwen3(
    out_dir: str | Path,
    seed: int = 0,
    base_config: str | None = None,
    dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> Path:
    """Save a random-weight Qwen3ForCausalLM + the real tokenizer to ``out_dir``.

    ``base_config``: a folder name under ``tests/fixtures/model_configs`` (e.g.
    ``Qwen3-Reranker-0.6B``) whose shapes to use; otherwise the tiny shapes above. ``overrides``
    change config fields (``num_hidden_layers=4`` for a shallower model of real width).
    """
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    if base_config:
        fields = json.loads(model_config_path(base_config).read_text())
        fields = {
            k: v
            for k, v in fields.items()
            if k not in ("architectures", "torch_dtype", "transformers_version")
        }
    else:
        fields = dict(TINY_QWEN3, vocab_size=len(tokenizer), tie_word_embeddings=True)
    fields.update(overrides)
    config = Qwen3Config(**fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(dtype)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
