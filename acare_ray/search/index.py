"""``acare index``: a corpus (Parquet or JSONL rows of ``doc_id``, ``title``, ``text``) -> an
index folder the service loads for ``/v1/search``.

The folder holds ``documents.parquet`` (the indexed rows, in index order), ``bm25/`` (the
:class:`~acare_ray.data.bm25.BM25Index` files) and ``acare_index.json`` (format, counts).
BM25 indexes ``title`` and ``text`` together; the reranker reads :func:`document_text`.

A row that cannot be indexed (``doc_id`` or ``text`` missing, empty or not a string, a ``title``
that is not a string, a ``doc_id`` seen before) is never dropped silently: it is listed with its
row number and reason in ``rejected.jsonl`` and counted in the manifest and the command's
output. A corpus with no indexable row is an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from acare_ray.data.bm25 import BM25Index
from acare_ray.data.io import read_jsonl

MANIFEST = "acare_index.json"
DOCUMENTS = "documents.parquet"
BM25_DIR = "bm25"
REJECTED = "rejected.jsonl"
FORMAT = 1


def document_text(title: str | None, text: str) -> str:
    """What the reranker reads for a document: ``title`` and ``text`` on two lines (or ``text``
    alone when there is no title)."""
    return f"{title}\n{text}" if title else text


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet" or path.is_dir():
        table = pq.read_table(path)
        for batch in table.to_batches():
            yield from batch.to_pylist()
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        yield from read_jsonl(path)
    else:
        raise ValueError(f"--input: {path} is neither Parquet (.parquet) nor JSONL (.jsonl)")


def _problem(row: Any, seen: set[str]) -> str | None:
    if not isinstance(row, dict):
        return "not an object"
    doc_id, text, title = row.get("doc_id"), row.get("text"), row.get("title")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id.strip():
        return "doc_id is missing or empty"
    if doc_id in seen:
        return f"doc_id {doc_id!r} repeats an earlier row"
    if not isinstance(text, str) or not text.strip():
        return "text is missing, empty or not a string"
    if title is not None and not isinstance(title, str):
        return "title is not a string"
    return None


@dataclass(frozen=True)
class IndexReport:
    out: Path
    documents: int
    rejected: int

    def describe(self) -> str:
        return f"indexed {self.documents} documents into {self.out}" + (
            f"; {self.rejected} rows rejected (see {self.out / REJECTED})" if self.rejected else ""
        )


def build_index(inputs: list[str | Path], out: str | Path) -> IndexReport:
    """Index the rows of ``inputs`` (in order) into the folder ``out``; see the module docstring."""
    out = Path(out)
    doc_ids: list[str] = []
    titles: list[str | None] = []
    texts: list[str] = []
    rejected: list[dict[str, Any]] = []
    seen: set[str] = set()
    for source in inputs:
        path = Path(source)
        if not path.exists():
            raise ValueError(f"--input: no file at {path}")
        for number, row in enumerate(_rows(path)):
            problem = _problem(row, seen)
            if problem is not None:
                rejected.append({"file": str(path), "row": number, "error": problem})
                continue
            doc_id = str(row["doc_id"])
            seen.add(doc_id)
            doc_ids.append(doc_id)
            titles.append(row.get("title") or None)
            texts.append(row["text"])
    if not doc_ids:
        raise ValueError(f"--input: no indexable row ({len(rejected)} rejected)")
    out.mkdir(parents=True, exist_ok=True)
    BM25Index([f"{t}\n{x}" if t else x for t, x in zip(titles, texts)]).save(out / BM25_DIR)
    table = pa.table(
        {
            "doc_id": pa.array(doc_ids, pa.string()),
            "title": pa.array(titles, pa.string()),
            "text": pa.array(texts, pa.string()),
        }
    )
    pq.write_table(table, out / DOCUMENTS)
    with (out / REJECTED).open("w", encoding="utf-8") as file:
        for entry in rejected:
            file.write(json.dumps(entry) + "\n")
    manifest = {"format": FORMAT, "documents": len(doc_ids), "rejected": len(rejected)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return IndexReport(out, len(doc_ids), len(rejected))


@dataclass(frozen=True)
class LoadedIndex:
    """An index folder in memory: the BM25 index and the documents by position."""

    bm25: BM25Index
    doc_ids: list[str]
    titles: list[str | None]
    texts: list[str]


def load_index(folder: str | Path) -> LoadedIndex:
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"search.index: {folder} has no {MANIFEST} (build it with acare index)"
        )
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"search.index: {folder} has format {manifest.get('format')}, not {FORMAT}"
        )
    table = pq.read_table(folder / DOCUMENTS)
    return LoadedIndex(
        bm25=BM25Index.load(folder / BM25_DIR, table.num_rows),
        doc_ids=table.column("doc_id").to_pylist(),
        titles=table.column("title").to_pylist(),
        texts=table.column("text").to_pylist(),
    )
