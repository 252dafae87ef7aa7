"""A third backend is one class and one registry line: the scorer, its error policy, the online
token accounting and checkpoints' acare.json use it with no edit anywhere else."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch import nn

from acare_ray.scoring import (
    BACKENDS,
    AgentContext,
    Backend,
    Mode,
    PromptConfig,
    ScoredSearch,
    Scorer,
    TokenLayout,
    score_isolated,
)
from acare_ray.scoring.backend import LoadRequest, Search, backend_class, detect_backend
from acare_ray.scoring.untrusted import InertTokenizer


class WordOverlapBackend(Backend):
    """Scores a document by how many of the sub-query's words it contains (no model)."""

    name = "word_overlap"
    document_lead = ""
    instruction_line = False
    default_prompt = PromptConfig(max_length=64)

    def __init__(self, request: LoadRequest) -> None:
        super().__init__(request.prompt, request.plan, request.device)
        self._tokenizer = request.tokenizer
        self._inert = InertTokenizer(request.tokenizer)
        self.weight = nn.Parameter(torch.ones(1))

    @classmethod
    def accepts(cls, architectures: Sequence[str]) -> bool:
        return "WordOverlap" in architectures

    @classmethod
    def load(cls, request: LoadRequest) -> WordOverlapBackend:
        return cls(request)

    def score_searches(self, searches: list[Search], cancel=None) -> list[ScoredSearch]:
        out = []
        for context, _, docs in searches:
            if any("explode" in d for d in docs):
                raise RuntimeError("this search makes the backend fail")
            words = _words(context.sub_query)
            scores = np.array([len(words & _words(d)) for d in docs], np.float32)
            out.append(ScoredSearch(scores, sum(len(_words(d)) for d in docs)))
        return out

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        return f"{context.sub_query} | {document}"

    @property
    def hf_model(self) -> nn.Module:
        return self

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def inert(self) -> InertTokenizer:
        return self._inert

    def trainable_module(self) -> nn.Module:
        return self

    def collate_groups(self, prompts, documents):
        raise NotImplementedError

    def context_tokens(self, context: AgentContext, mode: Mode) -> int:
        return len(self._inert.encode([context.sub_query])[0])

    def document_room(self, context_tokens: int) -> int:
        return self.max_length - context_tokens

    def request_cost(self, context_tokens: int, document_tokens: Sequence[int]) -> int:
        return sum(document_tokens) + context_tokens * len(document_tokens)


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(BACKENDS, WordOverlapBackend.name, f"{__name__}:WordOverlapBackend")
    return WordOverlapBackend.name


def test_a_registered_backend_scores_through_every_caller(registered, tiny_qwen3_dir):
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), backend=registered, device="cpu")
    assert isinstance(scorer.backend, WordOverlapBackend)
    assert scorer.config.max_length == 64  # the backend's own default prompt settings
    context = AgentContext("capital of Velmoria", question="Where was its founder born?")
    docs = ["Paris.", "Ostrava is the capital of Velmoria.", "The capital."]
    assert scorer.score(context, docs).tolist() == [0.0, 3.0, 1.0]
    assert scorer.rank(context, docs).indices.tolist() == [1, 2, 0]
    assert scorer.render(context, "Paris.", "M0") == "capital of Velmoria | Paris."
    out = score_isolated(scorer, [(context, docs), (context, ["explode"]), (context, ["of"])])
    assert [type(r) for r in out] == [np.ndarray, RuntimeError, np.ndarray]
    assert out[2].tolist() == [1.0]
    layout = TokenLayout(scorer)
    assert layout.instruction_line is False
    tokens = layout.context_tokens(context, Mode.M0)
    assert layout.cost(tokens, [5, 7]) == 12 + 2 * tokens
    assert scorer.acare_config()["backend"] == registered


def test_auto_detection_asks_each_registered_backend_in_order(monkeypatch, tmp_path):
    import acare_ray.scoring.backend as registry

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert", "architectures": ["WordOverlap"]}')
    # The new backend's one line, before the catch-all cross-encoder (which stays last).
    lines = dict(BACKENDS)
    catch_all = lines.popitem()
    lines[WordOverlapBackend.name] = f"{__name__}:WordOverlapBackend"
    monkeypatch.setattr(registry, "BACKENDS", dict([*lines.items(), catch_all]))
    assert detect_backend(str(folder), {}) == WordOverlapBackend.name
    assert detect_backend(str(folder), {"backend": "causal_lm"}) == "causal_lm"  # acare.json wins
    assert backend_class(WordOverlapBackend.name) is WordOverlapBackend
    with pytest.raises(ValueError, match="backend must be one of causal_lm, word_overlap, "):
        backend_class("nope")
