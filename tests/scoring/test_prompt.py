import json

import pytest
from transformers import AutoTokenizer

from acare_ray.data.io import data_dir
from acare_ray.scoring import AgentContext, FieldCaps, Mode, PromptConfig
from acare_ray.scoring.prompt import PromptEncoder, render
from acare_ray.testing import qwen3_tokenizer_dir

# The official recipe (QwenLM/Qwen3-Embedding, examples/qwen3_reranker_transformers.py), verbatim.
OFFICIAL_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
OFFICIAL_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
OFFICIAL_TASK = "Given a web search query, retrieve relevant passages that answer the query"


def official_prompt(query: str, doc: str, instruction: str = OFFICIAL_TASK) -> str:
    body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
    return OFFICIAL_PREFIX + body + OFFICIAL_SUFFIX


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())


@pytest.fixture(scope="module")
def paragraphs(require_data) -> list[str]:
    root = require_data(data_dir() / "musique")
    records = [json.loads(line) for line in (root / "AdelWang_MIGRES" / "musique.json").open()]
    records += json.loads((root / "OSU-NLP-Group_HippoRAG" / "musique_train.json").read_text())
    texts = [p["paragraph_text"] for r in records for p in r["paragraphs"]]
    return list(dict.fromkeys(texts))[:2000]


CONTEXT = AgentContext(
    "1998 Berlin award film",
    question="Who directed the film that won the Golden Bear in 1998?",
    reasoning="The Golden Bear is the top prize of the Berlin festival; I need the 1998 winner first.",
)


def test_m0_is_the_official_prompt_byte_for_byte():
    assert render(CONTEXT.for_mode(Mode.M0), "Some doc.", Mode.M0) == official_prompt(
        CONTEXT.sub_query, "Some doc."
    )


def test_m1_to_m3_follow_the_design_strings():
    q, r, s = CONTEXT.question, CONTEXT.reasoning, CONTEXT.sub_query
    m1 = (
        "Given a user generated web search query and the user's reasoning trace that motivated the query "
        "(when available), retrieve relevant passages that answer the query in light of the reasoning context"
    )
    m2 = (
        "Given a user generated query issued during an iterative research session and the original question "
        "(global query) that motivated the session, retrieve relevant passages that answer the query in light "
        "of the original question"
    )
    m3 = (
        "Given a user generated query, the original question (global query), and the user's reasoning trace "
        "(when available) that motivated the query, retrieve relevant passages that answer the query in light "
        "of the original question and reasoning context"
    )
    assert render(CONTEXT, "D", Mode.M1) == official_prompt(
        f"#Reasoning Trace: {r}\n#Query: {s}", "D", m1
    )
    assert render(CONTEXT, "D", Mode.M2) == official_prompt(
        f"#Original Question (global query): {q}\n#Query: {s}", "D", m2
    )
    assert render(CONTEXT, "D", Mode.M3) == official_prompt(
        f"#Original Question (global query): {q}\n#Reasoning Trace: {r}\n#Query: {s}", "D", m3
    )


def test_custom_instruction_replaces_the_default():
    text = render(CONTEXT, "D", Mode.M2, instruction="Find the award winner")
    assert "<Instruct>: Find the award winner\n" in text


@pytest.mark.parametrize("mode", list(Mode))
def test_concatenated_ids_equal_whole_prompt_on_real_paragraphs(tokenizer, paragraphs, mode):
    assert len(paragraphs) >= 1000
    encoder = PromptEncoder(tokenizer)
    prefix = encoder.prefix_ids(CONTEXT, mode)
    budget = encoder.document_budget(len(prefix))
    docs = encoder.document_ids(paragraphs, [budget] * len(paragraphs))
    whole = tokenizer(
        [encoder.render(CONTEXT, p, mode) for p in paragraphs], add_special_tokens=False
    )["input_ids"]
    mismatches = [
        i for i, (d, w) in enumerate(zip(docs, whole)) if prefix + d + encoder.suffix_ids != w
    ]
    assert mismatches == []


def test_yes_and_no_are_single_tokens_with_the_known_ids(tokenizer):
    encoder = PromptEncoder(tokenizer)
    assert (encoder.yes_id, encoder.no_id) == (9693, 2152)


def test_multi_token_answer_word_fails_clearly(tokenizer, monkeypatch):
    monkeypatch.setattr("acare_ray.scoring.prompt.YES_TOKEN", "yesterday's")
    with pytest.raises(ValueError, match="single token"):
        PromptEncoder(tokenizer)


def test_field_caps_keep_the_end_of_the_reasoning(tokenizer):
    encoder = PromptEncoder(
        tokenizer, PromptConfig(caps=FieldCaps(sub_query=4, question=5, reasoning=6))
    )
    long = AgentContext(
        "alpha beta gamma delta epsilon zeta eta",
        question="one two three four five six seven eight nine ten",
        reasoning="first second third fourth fifth sixth seventh eighth ninth tenth",
    )
    capped = encoder.capped(long)
    assert len(tokenizer(capped.sub_query, add_special_tokens=False)["input_ids"]) == 4
    assert capped.question.startswith("one") and len(tokenizer(capped.question)["input_ids"]) == 5
    assert capped.reasoning.endswith("tenth") and "first" not in capped.reasoning


def test_long_document_is_truncated_and_the_suffix_kept(tokenizer):
    encoder = PromptEncoder(tokenizer, PromptConfig(max_length=512))
    prefix = encoder.prefix_ids(CONTEXT, Mode.M3)
    budget = encoder.document_budget(len(prefix))
    (doc,) = encoder.document_ids(["word " * 1_000_000], [budget])
    assert len(prefix) + len(doc) + len(encoder.suffix_ids) == 512
    assert doc == tokenizer(" " + "word " * 2000, add_special_tokens=False)["input_ids"][:budget]


def test_the_context_memo_is_bounded_and_hands_out_copies():
    from acare_ray.scoring.prompt import ContextMemo

    memo = ContextMemo(entries=2, max_chars=50)
    made = []

    def make(value):
        def inner():
            made.append(value)
            return [value]

        return inner

    a, b, c = (AgentContext(q) for q in ("a", "b", "c"))
    first = memo.ids(a, Mode.M0, make(1))
    first.append(99)  # a caller's change stays its own
    assert memo.ids(a, Mode.M0, make(2)) == [1] and made == [1]
    assert memo.ids(a, Mode.M1, make(3)) == [3]  # the mode is part of the key
    memo.ids(b, Mode.M0, make(4))  # two entries at most: (a, M0) is the oldest and goes
    assert memo.ids(a, Mode.M0, make(5)) == [5] and made == [1, 3, 4, 5]
    long = AgentContext("x" * 51)
    memo.ids(long, Mode.M0, make(6))
    memo.ids(long, Mode.M0, make(7))  # longer than max_chars: never kept
    assert made[-2:] == [6, 7]

    def fails():
        raise ValueError("too long")

    with pytest.raises(ValueError):
        memo.ids(c, Mode.M0, fails)
    assert memo.ids(c, Mode.M0, make(8)) == [8]  # an error is not kept
