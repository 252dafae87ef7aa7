"""Where the datasets live (``data_dir()``), and Parquet / JSONL helpers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DATA_ENV = "ACARE_DATA_DIR"


def data_dir() -> Path:
    """The folder that holds the datasets (``musique/``, ``agent_traces/``; not in the repository).

    ``$ACARE_DATA_DIR`` when set, else ``<repository root>/../shared/data``.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


# Rows per Parquet row group in the files acare writes. Ray Data reads a row group as one block,
# so a file written as one row group (pyarrow's default holds up to 1M rows) reaches the job as
# one block: at 10^5 searches of 20 candidates that is ~0.5 GB read before any actor scores.
ROW_GROUP_ROWS = 1024


def write_parquet(
    table: pa.Table, path: str | os.PathLike, row_group_rows: int = ROW_GROUP_ROWS
) -> Path:
    """Write ``table`` to one Parquet file (parent folders created), ``row_group_rows`` rows per
    row group; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_rows)
    return path


def cast_by_name(array: pa.Array | pa.ChunkedArray, target: pa.DataType):
    """``array.cast(target)``, where struct fields are matched by name and a field the data lacks
    is all null, at any depth (structs in lists too). Recent pyarrow casts structs this way
    itself; older releases (17) refuse, so the struct and list levels are rebuilt here."""
    try:
        return array.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([cast_by_name(c, target) for c in array.chunks], type=target)
    kind = array.type
    if pa.types.is_struct(target) and pa.types.is_struct(kind):
        have = dict(zip((kind.field(i).name for i in range(kind.num_fields)), array.flatten()))
        children = [
            cast_by_name(have[f.name], f.type) if f.name in have else pa.nulls(len(array), f.type)
            for f in target
        ]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target) and pa.types.is_list(kind):
        values = cast_by_name(array.values, target.value_type)
        mask = array.is_null() if array.null_count else None
        return pa.ListArray.from_arrays(array.offsets, values, type=target, mask=mask)
    return array.cast(target)  # not a struct/list mismatch: raise the cast's own error


def read_parquet(path: str | os.PathLike, schema: pa.Schema | None = None) -> pa.Table:
    """Read a Parquet file or folder.

    With ``schema``: its columns come first, in its order and cast to its types; a column the
    file lacks is all null (row validation then names it); other columns are kept after them.
    """
    table = pq.read_table(path)
    if schema is None:
        return table
    columns, fields = [], []
    for field in schema:
        if field.name in table.column_names:
            columns.append(cast_by_name(table[field.name], field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
        fields.append(field)
    for name in table.column_names:
        if name not in schema.names:
            columns.append(table[name])
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def jsonl_lines(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """``(line number, record)`` for each non-blank line of a JSON-lines file (numbers from 1);
    where a line is not a JSON object, the reason (a ``str``) stands in place of the record, so
    a caller decides whether a bad line is fatal or a reported problem."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                yield number, f"not valid JSON ({err.msg})"
                continue
            if not isinstance(record, dict):
                yield number, f"expected an object, got {type(record).__name__}"
                continue
            yield number, record


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file; blank lines are skipped, a bad line names its number."""
    for number, record in jsonl_lines(path):
        if isinstance(record, str):
            raise ValueError(f"{path}:{number}: {record}")
        yield record


def write_jsonl(records: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> int:
    """Write records as JSON lines (UTF-8, non-ASCII kept); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count
