import numpy as np
import pytest
import torch
from scoring_support import CONTEXT, DOCUMENTS

from acare_ray.scoring import AgentContext, Mode, Scorer, rank_order
from acare_ray.scoring.batching import plan_batches


def test_scores_are_not_degenerate(naive_reference):
    assert np.ptp(naive_reference[Mode.M3]) > 0.05


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("budget", [1, 64, 200, 100_000])
def test_shared_prefix_scores_equal_the_naive_recipe(tiny_qwen3_dir, naive_reference, mode, budget):
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), max_batch_tokens=budget)
    np.testing.assert_allclose(
        scorer.score(CONTEXT, DOCUMENTS, mode), naive_reference[mode], atol=1e-4, rtol=0
    )


def test_one_by_one_equals_batched(tiny_scorer, naive_reference):
    alone = np.array([tiny_scorer.score(CONTEXT, [d], Mode.M3)[0] for d in DOCUMENTS])
    np.testing.assert_allclose(alone, naive_reference[Mode.M3], atol=1e-4, rtol=0)


def test_shuffled_candidates_keep_their_own_scores(tiny_scorer, naive_reference):
    order = np.random.default_rng(0).permutation(len(DOCUMENTS))
    shuffled = tiny_scorer.score(CONTEXT, [DOCUMENTS[i] for i in order], Mode.M2)
    np.testing.assert_allclose(shuffled, naive_reference[Mode.M2][order], atol=1e-4, rtol=0)


def test_score_many_equals_score_per_search(tiny_scorer):
    other = AgentContext("Velmoria capital")
    many = tiny_scorer.score_many(
        [(CONTEXT, DOCUMENTS), (other, DOCUMENTS[:3]), (other, [])], mode="auto"
    )
    np.testing.assert_allclose(many[0], tiny_scorer.score(CONTEXT, DOCUMENTS), atol=1e-5)
    np.testing.assert_allclose(many[1], tiny_scorer.score(other, DOCUMENTS[:3]), atol=1e-5)
    assert many[2].shape == (0,)


@pytest.mark.parametrize("packed", [False, True])
def test_score_resolved_returns_the_scores_and_the_tokens_really_computed(tiny_qwen3_dir, packed):
    """The online path: the mode chosen by the caller, scores as ``score`` gives them and the
    tokens the model computed per search (the usage a server answers, with no second
    tokenization), on the per-search and the packed paths."""
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", pack_searches=packed)
    other = AgentContext("Velmoria capital")
    searches = [
        (CONTEXT, Mode.M3, DOCUMENTS),
        (other, Mode.M0, DOCUMENTS[:2]),
        (other, Mode.M0, []),
    ]
    alone = []
    for context, mode, docs in searches:
        before = scorer.stats.real_tokens
        scores = scorer.score(context, docs, mode)
        alone.append((scores, scorer.stats.real_tokens - before))
    before = scorer.stats.real_tokens
    out = scorer.score_resolved(searches)
    assert sum(o.tokens for o in out) == scorer.stats.real_tokens - before
    for got, (scores, tokens) in zip(out, alone):
        np.testing.assert_allclose(got.scores, scores, atol=1e-5)
        assert got.tokens == tokens
    assert out[2].tokens == 0 and out[2].scores.shape == (0,)


def test_score_resolved_takes_a_concrete_mode_whose_fields_are_there(tiny_scorer):
    with pytest.raises(ValueError, match="concrete mode"):
        tiny_scorer.score_resolved([(CONTEXT, "auto", DOCUMENTS)])
    with pytest.raises(ValueError, match="reasoning") as err:
        tiny_scorer.score_resolved([(AgentContext("q", question="Q"), Mode.M3, DOCUMENTS)])
    assert err.value.field == "reasoning"


@pytest.mark.parametrize("budget", [64, 400, 100_000])
def test_packed_searches_score_as_one_search_at_a_time(tiny_qwen3_dir, tiny_scorer, budget):
    """Packing small searches into shared forwards (pack_searches) changes no score: mixed
    prefix lengths (M0 and M3), an empty search in the middle, packs cut by the budget."""
    packed = Scorer.from_pretrained(
        str(tiny_qwen3_dir), device="cpu", pack_searches=True, max_batch_tokens=budget
    )
    other = AgentContext("Velmoria capital")
    items = [
        (CONTEXT, DOCUMENTS[:3]),
        (other, DOCUMENTS[3:5]),
        (CONTEXT, []),
        (other, DOCUMENTS),
        (CONTEXT, DOCUMENTS[5:]),
    ]
    calls = []
    score_pack = packed.backend._score_pack
    packed.backend._score_pack = lambda p, q: calls.append(len(p)) or score_pack(p, q)
    got = packed.score_many(items, mode="auto")
    want = tiny_scorer.score_many(items, mode="auto")
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)
    packs = packed.backend._packs(
        [[0] * n for n in (80, 10, 80, 10, 80)], [[[0] * 30] * k for k in (3, 2, 0, 7, 2)]
    )
    assert sorted(i for pack in packs for i in pack) == list(range(5))
    assert [2] in packs
    if budget == 100_000:
        assert packs == [[0, 1], [2], [3, 4]]
        assert calls == [2, 2]  # the real searches packed the same way


def test_multi_prefix_forward_equals_single_prefix(tiny_scorer):
    """The training path (several groups' prefixes in one forward) matches inference."""
    backend = tiny_scorer.backend
    encoder, module = backend.encoder, backend.module
    contexts = [(CONTEXT, Mode.M3), (AgentContext("Velmoria capital"), Mode.M0)]
    prefixes = [encoder.prefix_ids(c, m) for c, m in contexts]
    width = max(map(len, prefixes))
    prefix_ids = torch.zeros(2, width, dtype=torch.long)
    prefix_mask = torch.zeros(2, width, dtype=torch.bool)
    for i, p in enumerate(prefixes):
        prefix_ids[i, : len(p)] = torch.tensor(p)
        prefix_mask[i, : len(p)] = True
    docs = encoder.document_ids(DOCUMENTS[:3] * 2, [1000] * 6)
    seqs = [d + encoder.suffix_ids for d in docs]
    ids = torch.zeros(6, max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    with torch.no_grad():
        joint = module(prefix_ids, prefix_mask, ids, lengths, group).numpy()
    expected = np.concatenate(
        [
            tiny_scorer.score(CONTEXT, DOCUMENTS[:3], Mode.M3),
            tiny_scorer.score(contexts[1][0], DOCUMENTS[:3], Mode.M0),
        ]
    )
    np.testing.assert_allclose(joint, expected, atol=1e-4, rtol=0)


def test_rank_sorts_best_first(tiny_scorer):
    ranking = tiny_scorer.rank(CONTEXT, DOCUMENTS)
    scores = tiny_scorer.score(CONTEXT, DOCUMENTS)
    assert np.all(np.diff(ranking.scores) <= 0)
    assert sorted(ranking.indices.tolist()) == list(range(len(DOCUMENTS)))
    np.testing.assert_allclose(ranking.scores, scores[ranking.indices], atol=1e-6)
    np.testing.assert_array_equal(
        tiny_scorer.rank(CONTEXT, DOCUMENTS, top_k=2).indices, ranking.indices[:2]
    )


def test_rank_order_is_stable_on_ties():
    scores = np.array([0.5, 1.0, 0.5, 2.0, 0.5], dtype=np.float32)
    assert rank_order(scores).tolist() == [3, 1, 0, 2, 4]
    assert rank_order(scores, top_k=3).tolist() == [3, 1, 0]


def test_scores_are_float32_in_input_order(tiny_scorer):
    scores = tiny_scorer.score(CONTEXT, DOCUMENTS)
    assert scores.dtype == np.float32 and scores.shape == (len(DOCUMENTS),)


def test_empty_document_list_gives_empty_array(tiny_scorer):
    assert tiny_scorer.score(CONTEXT, []).shape == (0,)


@pytest.mark.parametrize(
    ("docs", "message"),
    [
        (["ok", None], r"documents\[1\] is None"),
        (["ok", "  "], r"documents\[1\] is empty"),
        ([3], r"documents\[0\] must be a string"),
        ("a string", "list of strings"),
    ],
)
def test_bad_documents_name_their_index(tiny_scorer, docs, message):
    with pytest.raises(ValueError, match=message):
        tiny_scorer.score(CONTEXT, docs)


def test_forced_mode_without_its_field_fails_clearly(tiny_scorer):
    with pytest.raises(ValueError, match="question"):
        tiny_scorer.score(AgentContext("q"), ["doc"], mode="M2")


def test_over_long_document_is_truncated_not_an_error(tiny_qwen3_dir):
    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), max_length=600)
    huge = "lorem ipsum dolor " * 60_000
    scores = scorer.score(CONTEXT, [huge, DOCUMENTS[0]])
    assert np.isfinite(scores).all()
    assert scorer.stats.computed_tokens < 2 * 600 + 200


def test_token_budget_plan_covers_every_index_once_within_budget():
    lengths = np.random.default_rng(1).integers(1, 300, size=257)
    batches = plan_batches(lengths, max_tokens=1000, max_rows=64)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(257))
    for b in batches:
        assert len(b) <= 64
        assert len(b) == 1 or len(b) * lengths[b].max() <= 1000


def test_padding_efficiency_is_high_with_length_sorting(tiny_scorer):
    docs = [("word " * n).strip() for n in np.random.default_rng(0).integers(5, 200, size=100)]
    before = (tiny_scorer.stats.real_tokens, tiny_scorer.stats.computed_tokens)
    tiny_scorer.score(CONTEXT, docs)
    real = tiny_scorer.stats.real_tokens - before[0]
    computed = tiny_scorer.stats.computed_tokens - before[1]
    assert real / computed > 0.9


class _Flaky:
    """A stand-in scorer: ``score_many`` fails for a batch holding a search with no documents
    (``ValueError``) or with the document "boom" (``RuntimeError``)."""

    def __init__(self) -> None:
        self.calls = 0

    def score_many(self, items, mode):
        self.calls += 1
        for _, docs in items:
            if not docs:
                raise ValueError("documents: empty")
            if "boom" in docs:
                raise RuntimeError("device lost")
        return [np.zeros(len(docs), dtype=np.float32) for _, docs in items]


def test_score_isolated_fails_only_the_bad_search():
    from acare_ray.scoring import score_isolated

    ok, empty, boom = (
        (AgentContext("q"), ["a", "b"]),
        (AgentContext("q"), []),
        (
            AgentContext("q"),
            ["boom"],
        ),
    )
    scorer = _Flaky()
    out = score_isolated(scorer, [ok, empty, ok], "M0")
    assert [type(r) for r in out] == [np.ndarray, ValueError, np.ndarray]
    assert scorer.calls == 1 + 3  # the batch, then each search alone
    # Any exception fails only its own search (online too: issue 21.4).
    out = score_isolated(_Flaky(), [ok, boom], "M0")
    assert [type(r) for r in out] == [np.ndarray, RuntimeError]
    single = _Flaky()
    assert isinstance(score_isolated(single, [empty], "M0")[0], ValueError)
    assert single.calls == 1  # one search alone is not tried twice
    assert score_isolated(_Flaky(), [], "M0") == []


def test_both_backends_implement_the_one_backend_protocol(tiny_scorer, minilm_scorer):
    """Scorer, trainer, checkpoints and online token accounting use ``acare_ray.scoring.backend.Backend``
    and never branch on which backend it is."""
    import inspect

    import acare_ray.scoring.tokens
    import acare_ray.training.checkpoint
    import acare_ray.training.collator
    import acare_ray.training.loop
    from acare_ray.scoring import Backend

    for scorer in (tiny_scorer, minilm_scorer):
        backend = scorer.backend
        assert isinstance(backend, Backend)
        assert backend.hf_model is not None and backend.tokenizer is not None
        context_tokens = backend.context_tokens(AgentContext("capital population"), Mode.M0)
        assert 0 < context_tokens < backend.max_length
        assert backend.document_room(context_tokens) > 0
        assert backend.request_cost(context_tokens, []) == 0
    for module in (
        acare_ray.scoring.tokens,
        acare_ray.training.checkpoint,
        acare_ray.training.collator,
        acare_ray.training.loop,
    ):
        assert "backend.name ==" not in inspect.getsource(module), module.__name__


def test_options_override_a_given_config_even_back_to_a_default():
    """``from_pretrained(config=..., **options)``: an option wins over the config, also when it
    sets a field back to its default; None keeps the config's value; unknown names raise."""
    from acare_ray.scoring import ScorerConfig

    base = ScorerConfig(compile=True, max_batch_tokens=99, max_length=300)
    merged = ScorerConfig.from_options({"compile": False, "max_length": None}, base=base)
    assert (merged.compile, merged.max_batch_tokens, merged.max_length) == (False, 99, 300)
    with pytest.raises(TypeError, match="unknown Scorer options: bogus"):
        ScorerConfig.from_options({"bogus": 1})


def test_a_model_folders_tokenizer_is_parsed_once_until_a_file_in_it_changes(tiny_qwen3_copy):
    from acare_ray.scoring.config import load_tokenizer

    first = Scorer.from_pretrained(str(tiny_qwen3_copy), max_batch_tokens=64)
    second = Scorer.from_pretrained(str(tiny_qwen3_copy), max_batch_tokens=64)
    assert second.backend.tokenizer is first.backend.tokenizer
    np.testing.assert_array_equal(
        first.score(CONTEXT, DOCUMENTS, Mode.M3), second.score(CONTEXT, DOCUMENTS, Mode.M3)
    )
    config = tiny_qwen3_copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"model_max_length": ', '"model_max_length": 1'))
    reread = load_tokenizer(str(tiny_qwen3_copy))
    assert reread is not first.backend.tokenizer
    assert reread.model_max_length == int("1" + str(first.backend.tokenizer.model_max_length))


def test_a_hub_names_tokenizer_is_loaded_each_time(monkeypatch):
    from transformers import AutoTokenizer

    from acare_ray.scoring.config import load_tokenizer

    calls = []
    monkeypatch.setattr(
        AutoTokenizer, "from_pretrained", lambda path, revision=None: calls.append(revision)
    )
    load_tokenizer("some-org/some-reranker", "v1")
    load_tokenizer("some-org/some-reranker", "v1")
    assert calls == ["v1", "v1"]
