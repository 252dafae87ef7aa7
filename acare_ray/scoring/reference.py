"""The official Hugging Face recipe for Qwen3-Reranker: the one reference our scores are checked
against (the tests, :mod:`acare_ray.scoring.golden`'s check of a base model) and the baseline
the benchmarks beat.

Follows QwenLM/Qwen3-Embedding ``examples/qwen3_reranker_transformers.py`` (README): the system
prefix and the suffix are tokenized once, each ``<Instruct>/<Query>/<Document>`` pair text is
tokenized whole, ids are concatenated, ``tokenizer.pad`` left-pads a fixed-size batch, and
``model(**inputs).logits[:, -1, :]`` gives the yes/no logits. ``last_logits_only=True`` is the
strong baseline: the same recipe with ``logits_to_keep=1``, so the vocabulary head runs on the
last position only. Scores are returned as log-odds, ``logit(yes) - logit(no)``, which the
official ``log_softmax(...)[:, 1].exp()`` maps to ``sigmoid(log-odds)``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from acare_ray.scoring.prompt import SUFFIX, SYSTEM_PREFIX


@dataclass
class RecipeStats:
    real_tokens: int = 0
    computed_tokens: int = 0
    tokenize_s: float = 0.0
    batches: list[int] = field(default_factory=list)

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0


class OfficialRecipe:
    """Scores prompt bodies (everything between the system prefix and the suffix)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        batch_size: int,
        last_logits_only: bool,
        max_length: int = 8192,
    ) -> None:
        if tokenizer.padding_side != "left":
            raise ValueError(
                "the official recipe left-pads: load the tokenizer with padding_side='left'"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.last_logits_only = last_logits_only
        self.max_length = max_length
        self.prefix_tokens = tokenizer.encode(SYSTEM_PREFIX, add_special_tokens=False)
        self.suffix_tokens = tokenizer.encode(SUFFIX, add_special_tokens=False)
        self.yes_id = tokenizer.convert_tokens_to_ids("yes")
        self.no_id = tokenizer.convert_tokens_to_ids("no")
        self.stats = RecipeStats()

    def process_inputs(self, pairs: list[str]) -> dict[str, torch.Tensor]:
        inputs = self.tokenizer(
            pairs,
            padding=False,
            truncation="longest_first",
            return_attention_mask=False,
            max_length=self.max_length - len(self.prefix_tokens) - len(self.suffix_tokens),
        )
        for i, ids in enumerate(inputs["input_ids"]):
            inputs["input_ids"][i] = self.prefix_tokens + ids + self.suffix_tokens
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`max_length` is ignored")
            inputs = self.tokenizer.pad(
                inputs, padding=True, return_tensors="pt", max_length=self.max_length
            )
        device = next(self.model.parameters()).device
        return {key: value.to(device) for key, value in inputs.items()}

    def compute_logits(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if self.last_logits_only else {}
        logits = self.model(**inputs, **extra).logits[:, -1, :]
        return (logits[:, self.yes_id] - logits[:, self.no_id]).float()

    def score(self, pairs: list[str]) -> np.ndarray:
        """Log-odds per pair body, in input order, ``batch_size`` pairs per forward."""
        out = []
        with torch.inference_mode():
            for start in range(0, len(pairs), self.batch_size):
                began = time.perf_counter()
                inputs = self.process_inputs(pairs[start : start + self.batch_size])
                self.stats.tokenize_s += time.perf_counter() - began
                mask = inputs["attention_mask"]
                self.stats.real_tokens += int(mask.sum())
                self.stats.computed_tokens += mask.numel()
                self.stats.batches.append(mask.shape[1])
                out.append(self.compute_logits(inputs).cpu().numpy())
        return np.concatenate(out) if out else np.empty(0, dtype=np.float32)


def reference_scores(
    model_dir: str, texts: Sequence[str], revision: str | None = None
) -> np.ndarray:
    """Log-odds of whole rendered prompts (:func:`acare_ray.scoring.prompt.render`) by the
    official recipe with the full causal LM in float32, all in one left-padded batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left", revision=revision)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, revision=revision
    ).eval()
    recipe = OfficialRecipe(model, tokenizer, max(len(texts), 1), last_logits_only=False)
    return recipe.score([pair_body(text) for text in texts])


def pair_body(prompt: str) -> str:
    """The official ``<Instruct>: ...<Document>: doc`` body of a full rendered prompt."""
    if not (prompt.startswith(SYSTEM_PREFIX) and prompt.endswith(SUFFIX)):
        raise ValueError("prompt does not carry the Qwen3-Reranker system prefix and suffix")
    return prompt[len(SYSTEM_PREFIX) : -len(SUFFIX)]
