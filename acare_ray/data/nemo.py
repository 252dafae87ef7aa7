"""NeMo Automodel context-aware reranker JSONL <-> ``TRAINING_GROUPS``.

A NeMo record (inline-text retrieval format, one JSON object per line)::

    {"query_id": ..., "global_qid": ..., "query": "...", "reasoning": "..." | null,
     "global_query": "..." | null, "pos_doc": DOC | [DOC, ...], "neg_doc": DOC | [DOC, ...]}

where DOC is a string or an object with ``text`` (NeMo's inline loader accepts both). Field
mapping: query_id <-> group_id, global_qid <-> session_id, query <-> sub_query,
global_query <-> question, reasoning <-> reasoning. Ids may be numbers; they become strings.

NeMo's inline docs carry no ids, so the writer keeps ours in two extra keys that NeMo ignores,
``pos_doc_id`` and ``neg_doc_id`` (list); docs read without them get ``sha1:<hex16>`` of their
text. NeMo trains on the first positive only; a record with several positives is read as one
group per positive (``group_id`` suffixed ``#k``), so nothing is dropped.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from acare_ray.data.io import read_jsonl, write_jsonl
from acare_ray.data.schema import TRAINING_GROUPS, parse_group


def content_id(text: str) -> str:
    """A stable doc id for a document that came without one."""
    return "sha1:" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _id(value: Any, where: str, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"{where}: {field} must be a string or integer, got {value!r}")
    return str(value)


def _docs(record: Mapping[str, Any], field: str, ids_field: str, where: str) -> list[dict]:
    docs = _as_list(record.get(field))
    ids = _as_list(record.get(ids_field))
    if ids and len(ids) != len(docs):
        raise ValueError(f"{where}: {ids_field} has {len(ids)} ids for {len(docs)} {field} docs")
    out = []
    for i, doc in enumerate(docs):
        text = doc.get("text") if isinstance(doc, Mapping) else doc
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: {field}[{i}] has no text")
        doc_id = _id(ids[i], where, f"{ids_field}[{i}]") if ids else None
        out.append({"doc_id": doc_id or content_id(text), "text": text})
    return out


def records_to_groups(records: Iterable[Mapping[str, Any]], source: str = "record") -> pa.Table:
    """NeMo records -> ``TRAINING_GROUPS``; a bad record raises ValueError naming
    ``<source> record <n>`` and the field. A missing ``global_qid`` falls back to the query id."""
    rows = []
    for number, record in enumerate(records, start=1):
        where = f"{source} record {number}"
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
        query_id = _id(record.get("query_id"), where, "query_id") or f"{source}#{number}"
        where = f"{where} (query_id={query_id})"
        positives = _docs(record, "pos_doc", "pos_doc_id", where)
        negatives = _docs(record, "neg_doc", "neg_doc_id", where)
        if not positives:
            raise ValueError(f"{where}: pos_doc is empty")
        if not negatives:
            raise ValueError(f"{where}: neg_doc is empty")
        for k, positive in enumerate(positives):
            row = {
                "group_id": query_id if len(positives) == 1 else f"{query_id}#{k}",
                "session_id": _id(record.get("global_qid"), where, "global_qid") or query_id,
                "sub_query": record.get("query"),
                "question": record.get("global_query"),
                "reasoning": record.get("reasoning"),
                "positive": positive,
                "negatives": negatives,
            }
            try:
                group = parse_group(row)
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
            ctx = group.context
            rows.append({**row, "question": ctx.question, "reasoning": ctx.reasoning})
    return pa.Table.from_pylist(rows, schema=TRAINING_GROUPS)


def groups_to_records(table: pa.Table) -> list[dict[str, Any]]:
    """``TRAINING_GROUPS`` -> NeMo records (absent context fields are ``null``)."""
    records = []
    for index, row in enumerate(table.to_pylist()):
        group = parse_group(row, index)
        records.append(
            {
                "query_id": group.group_id,
                "global_qid": group.session_id,
                "query": group.context.sub_query,
                "reasoning": group.context.reasoning,
                "global_query": group.context.question,
                "pos_doc": group.positive.text,
                "neg_doc": [d.text for d in group.negatives],
                "pos_doc_id": group.positive.doc_id,
                "neg_doc_id": [d.doc_id for d in group.negatives],
            }
        )
    return records


def read_nemo_jsonl(path: str | os.PathLike) -> pa.Table:
    """Read a NeMo JSONL file as ``TRAINING_GROUPS``."""
    return records_to_groups(read_jsonl(path), source=str(path))


def write_nemo_jsonl(table: pa.Table, path: str | os.PathLike) -> int:
    """Write ``TRAINING_GROUPS`` as NeMo JSONL; returns the number of records."""
    return write_jsonl(groups_to_records(table), path)
