"""The trace importer: R1-Searcher and generic trajectories -> searches with page labels."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from acare_ray.data.io import data_dir
from acare_ray.data.traces import (
    build_searches,
    import_traces,
    page_key,
    parse_r1_steps,
    read_generic,
    read_r1_searcher,
    write_generic,
)

TRACES = data_dir() / "agent_traces"
QWEN = TRACES / "r1-searcher" / "hotpotqa_qwen.jsonl"
LLAMA = TRACES / "r1-searcher" / "hotpotqa_llama.jsonl"
GOLD = TRACES / "hotpotqa_gold.jsonl"


@pytest.fixture(scope="module")
def traces_dir(require_data) -> Path:
    require_data(QWEN)
    return TRACES


@pytest.fixture(scope="module")
def imported(traces_dir):
    return import_traces([QWEN, LLAMA], "r1-searcher", GOLD, k=100)


TEXT = (
    "I need the director. <|begin_of_query|> 1998 Golden Bear <|end_of_query|>\n\n"
    "<|begin_of_documents|>\n(1)Title: Central Station (film) Text:  Won the Golden Bear.\n"
    '(2)"Title: Walter Salles Text:  A ""Brazilian"" director."\n<|end_of_documents|>\n\n'
    "So the film is Central Station. Now its director."
    "<|begin_of_query|> Central Station director<|end_of_query|>\n"
    "<|begin_of_documents|>\n(1)Title: Walter Salles Text: Directed it.\n<|end_of_documents|>"
    " <answer> Walter Salles </answer>"
)


def test_r1_steps_take_the_current_turn_as_reasoning_and_unquote_passages():
    steps, problems = parse_r1_steps(TEXT)
    assert problems == []
    assert [s.query for s in steps] == ["1998 Golden Bear", "Central Station director"]
    assert steps[0].reasoning == "I need the director."
    assert steps[1].reasoning == "So the film is Central Station. Now its director."
    assert steps[0].documents == (
        ("Central Station (film)", "Won the Golden Bear."),
        ("Walter Salles", 'A "Brazilian" director.'),
    )


def test_a_search_without_reasoning_has_none_and_a_bad_passage_is_reported():
    steps, problems = parse_r1_steps(
        "<|begin_of_query|> q1 <|end_of_query|><|begin_of_documents|>\n(1) garbage\n"
        "<|end_of_documents|><|begin_of_query|>  <|end_of_query|>"
    )
    assert len(steps) == 1 and steps[0].reasoning is None and steps[0].documents == ()
    assert "search 1: a passage in neither layout" in problems[0]
    assert "imported without its documents" in problems[0]
    assert "search 2: the query is empty (skipped)" in problems[1]


def test_unlabelled_passages_split_at_the_run_of_spaces_after_the_title():
    """The other layout R1-Searcher logs print: the title, a run of spaces, then the text
    (often repeating the title). Both layouts may sit in one documents block."""
    steps, problems = parse_r1_steps(
        "<|begin_of_query|> Golden Bear 1998 <|end_of_query|><|begin_of_documents|>\n"
        "(1)Central Station (film)    Central Station (film) Central Station is a 1998 film.\n"
        "(2)Title: Walter Salles Text: A director.\n"
        "(3)Berlin Film Festival\tThe festival awards the Golden Bear.\n"
        "<|end_of_documents|>"
    )
    assert problems == []
    assert steps[0].documents == (
        ("Central Station (film)", "Central Station (film) Central Station is a 1998 film."),
        ("Walter Salles", "A director."),
        ("Berlin Film Festival", "The festival awards the Golden Bear."),
    )


def test_a_lost_documents_import_fails_unless_told_to_keep_going(tmp_path, capsys):
    from acare_ray.cli import main

    record = {
        "question": "Who directed Central Station?",
        "answer": "Walter Salles",
        "gen_text_store": "<|begin_of_query|> q1 <|end_of_query|><|begin_of_documents|>\n"
        "(1)Title: Walter Salles Text: A director.\n<|end_of_documents|>"
        "<|begin_of_query|> q2 <|end_of_query|><|begin_of_documents|>\n(1)garbage\n"
        "<|end_of_documents|>",
    }
    log = tmp_path / "eval_agent.jsonl"
    log.write_text(json.dumps(record) + "\n", encoding="utf-8")
    out = tmp_path / "searches.parquet"
    argv = ["import-traces", "--input", str(log), "--output", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{log}:1: search 2: a passage in neither layout" in err
    assert "1 search(es) lost their documents" in err and not out.exists()
    assert main([*argv, "--keep-going"]) == 0
    assert pq.read_table(out).num_rows == 2


def test_page_key_drops_case_accents_and_punctuation():
    assert page_key("Pokémon: The Movie 2000!") == page_key("pokemon the movie 2000")
    assert page_key("Spider-Man (pinball)") == "spider man pinball"


def test_shared_traces_import_every_session_and_search(imported):
    table = imported.table
    agents = table.column("agent").to_pylist()
    assert agents.count("qwen") == 632 and agents.count("llama") == 829
    assert imported.sessions == 604 and imported.searches == 1461
    assert imported.problems == [] and imported.sessions_without_gold == 0
    sessions = {(a, s) for a, s in zip(agents, table.column("session_id").to_pylist())}
    for agent, path in (("qwen", QWEN), ("llama", LLAMA)):
        lines = path.read_text(encoding="utf-8").splitlines()
        searching = sum(
            "<|begin_of_query|>" in json.loads(line)["gen_text_store"] for line in lines
        )
        assert len(lines) == 302  # a trajectory that answers without searching adds no search
        assert sum(a == agent for a, _ in sessions) == searching
    steps = {}
    for sid, step in zip(table.column("session_id").to_pylist(), table.column("step").to_pylist()):
        steps.setdefault(sid, []).append(step)
    assert all(v == list(range(1, len(v) + 1)) for v in steps.values())


def test_reasoning_is_the_current_turn_only(imported, traces_dir):
    raw = {}
    for path, agent in ((QWEN, "qwen"), (LLAMA, "llama")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            raw[agent, " ".join(record["question"].split())] = record["gen_text_store"]
    rows = imported.table.select(["agent", "question", "reasoning", "sub_query"]).to_pylist()
    with_reasoning = 0
    for row in rows:
        reasoning = row["reasoning"]
        if reasoning is None:
            continue
        with_reasoning += 1
        for marker in (
            "<|begin_of_query|>",
            "<|end_of_query|>",
            "<|begin_of_documents|>",
            "<|end_of_documents|>",
            "Title:",
        ):
            assert marker not in reasoning
        text = raw[row["agent"], " ".join(row["question"].split())]
        assert reasoning in text
        before = text[: text.index(reasoning)]
        turn_start = before.rfind("<|end_of_documents|>")
        assert "<|begin_of_query|>" not in before[turn_start + 1 :] if turn_start >= 0 else True
    turns = [
        piece.rsplit("<|end_of_documents|>", 1)[-1]
        for text in raw.values()
        for piece in text.split("<|begin_of_query|>")[:-1]
    ]
    assert len(turns) == len(rows)
    assert with_reasoning == sum(bool(t.strip()) for t in turns)


def test_candidates_are_the_agents_passages_plus_bm25_with_page_labels(imported):
    for row in imported.table.slice(0, 50).to_pylist():
        candidates = row["candidates"]
        ids = [c["doc_id"] for c in candidates]
        assert len(ids) == len(set(ids))
        agent = [c for c in candidates if c["origin"] in ("agent", "agent+bm25")]
        assert [c["agent_rank"] for c in agent] == list(range(1, len(agent) + 1))
        assert 1 <= len(agent) <= 5
        assert sum(c["origin"] != "agent" for c in candidates) == 100
        gold = set(row["supporting_pages"])
        for c in candidates:
            assert c["relevance"] == int(c["page"] in gold)
            assert c["page"] == page_key(c["text"].split("\n", 1)[0])
            assert (c["first_stage_score"] is None) == (c["origin"] == "agent")


def test_a_malformed_line_is_reported_and_the_rest_imports(traces_dir, tmp_path):
    lines = QWEN.read_text(encoding="utf-8").splitlines()[:3]
    broken = tmp_path / "broken_qwen.jsonl"
    broken.write_text(
        "\n".join([lines[0], "{not json", lines[1], '{"question": "q"}', lines[2]]) + "\n",
        encoding="utf-8",
    )
    problems = []
    trajectories = read_r1_searcher(broken, problems=problems)
    assert len(trajectories) == 3
    assert [p.line for p in problems] == [2, 4]
    assert "not valid JSON" in problems[0].message
    assert "gen_text_store is missing" in problems[1].message
    result = import_traces([broken], "r1-searcher", GOLD)
    assert result.sessions == 3 and len(result.problems) == 2


def test_generic_format_round_trips_to_the_same_searches(traces_dir, tmp_path):
    original = read_r1_searcher(QWEN)[:20]
    path = tmp_path / "generic.jsonl"
    assert write_generic(original, path) == 20
    problems = []
    again = read_generic(path, problems)
    assert problems == [] and again == original
    a, _ = build_searches(original, k=10)
    b, _ = build_searches(again, k=10)
    assert a.equals(b)


def test_generic_bad_steps_are_reported_and_the_session_kept(tmp_path):
    path = tmp_path / "mine.jsonl"
    good = {
        "reasoning": "r",
        "query": "Berlin film award",
        "documents": [{"title": "Golden Bear", "text": "Berlin festival top award"}],
    }
    records = [
        {
            "session_id": "s1",
            "question": "Q?",
            "supporting_titles": ["Golden Bear"],
            "steps": [good, {"query": ""}, {"query": "q two", "documents": [{"title": "B"}]}],
        },
        {"question": "no session"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = import_traces([path], "generic", None, k=5)
    assert result.searches == 1 and result.sessions == 1
    messages = [str(p) for p in result.problems]
    assert any(":1: steps[1].query is missing or empty; step skipped" in m for m in messages)
    assert any(":1: steps[2].documents[0] needs a string title" in m for m in messages)
    assert any(":2: session_id is missing" in m for m in messages)
    row = result.table.to_pylist()[0]
    assert row["search_id"] == "s1:s1" and row["reasoning"] == "r"
    assert [c["relevance"] for c in row["candidates"]] == [1]
