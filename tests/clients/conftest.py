"""Fixtures for the agent plug-in tests: a small corpus, its index, and an in-process app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agents_support import CORPUS


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    return path


@pytest.fixture(scope="session")
def index_dir(corpus_file, tmp_path_factory) -> Path:
    from acare_ray.search.index import build_index

    out = tmp_path_factory.mktemp("index") / "idx"
    build_index([corpus_file], out)
    return out
