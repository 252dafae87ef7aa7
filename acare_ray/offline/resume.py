"""Resumable output folders: the output itself says which searches are done.

An output folder holds the Parquet part files the jobs write, named
``{run_id}_{write_uuid}_{task:06}-{i}.parquet``, and ``_acare_job.json`` (what wrote them:
job, model, modes, ...; readers skip files starting with ``_``). There is no separate
checkpoint to lose or to fall out of step with the data:

- **Commit marker.** A Parquet footer is written last and a file cannot be opened without it,
  so a part file whose footer reads holds all of its rows. Part files without a readable
  footer (a writer died mid-file) are deleted before a run; their rows count as not written.
- **Done set.** A Ray task (0 CPUs, so it never waits behind the actor pool) reads the
  ``search_id`` column of the complete part files one file at a time and returns a sorted
  array of 128-bit BLAKE2b digests, 16 bytes per id, to the object store. The driver holds
  only its reference. A chance collision would need ~2^64 ids.
- **Skip.** :func:`skip_written` drops input rows whose digest is in that array (binary
  search) before they reach the scorer; Ray Data fuses it into the actor's map stage.
- **No duplicates on retry.** A write task's file name depends only on (write uuid, task
  index), so a retried write overwrites its own file instead of adding a second copy; a
  killed actor's batch is retried whole and its partial output is never returned.

Rows without a ``search_id`` cannot be matched, so each run writes their error row again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

MANIFEST = "_acare_job.json"
DIGEST_DTYPE = np.dtype("S16")


def resolve(path: str) -> tuple[pafs.FileSystem, str, str]:
    """``(filesystem, path inside it, path for Ray)``; a plain path is made absolute."""
    if "://" not in path:
        path = os.path.abspath(path)
        return pafs.LocalFileSystem(), path, path
    fs, inner = pafs.FileSystem.from_uri(path)
    return fs, inner, path


def part_files(fs: pafs.FileSystem, root: str) -> list[str]:
    """Parquet part files under ``root`` (sorted; hidden and ``_`` files excluded)."""
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    return sorted(
        info.path
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.path.endswith(".parquet")
        and not posixpath.basename(info.path).startswith(("_", "."))
    )


def readable(fs: pafs.FileSystem, path: str) -> bool:
    try:
        with fs.open_input_file(path) as f:
            pq.ParquetFile(f).metadata  # noqa: B018 - reading the footer is the check
        return True
    except (OSError, pa.ArrowInvalid):
        return False


def digests(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """128-bit BLAKE2b digest of each non-null id, as ``S16`` (nulls are dropped)."""
    values = pc.drop_null(ids).to_pylist()
    out = np.empty(len(values), dtype=DIGEST_DTYPE)
    for i, value in enumerate(values):
        out[i] = hashlib.blake2b(value.encode("utf-8"), digest_size=16).digest()
    return out


def _written_digests(fs: pafs.FileSystem, files: list[str], column: str) -> np.ndarray:
    parts = []
    for path in files:
        with fs.open_input_file(path) as f:
            parts.append(digests(pq.read_table(f, columns=[column])[column]))
    if not parts:
        return np.empty(0, dtype=DIGEST_DTYPE)
    return np.unique(np.concatenate(parts))


def _unwritten_rows(fs: pafs.FileSystem, files: list[str], column: str, done: np.ndarray) -> int:
    remaining = 0
    for path in files:
        with fs.open_input_file(path) as f:
            table = pq.read_table(f, columns=[column])
        remaining += skip_written(table, [done], column).num_rows
    return remaining


def unwritten_rows(input_path: str, written: Any, column: str = "search_id") -> int:
    """How many input rows a run would score: rows whose id is null or not yet written.

    Reads only the id column, in a Ray task; lets a finished job return without starting
    its actors."""
    import ray

    fs, root, _ = resolve(input_path)
    info = fs.get_file_info(root)
    files = [root] if info.type == pafs.FileType.File else part_files(fs, root)
    task = ray.remote(num_cpus=0)(_unwritten_rows)
    return ray.get(task.remote(fs, files, column, written))


def skip_written(batch: pa.Table, written: list[Any], column: str = "search_id") -> pa.Table:
    """``batch`` without the rows whose ``column`` digest is in ``written[0]`` (a sorted digest
    array or its object ref). Rows with a null id are kept."""
    done = written[0]
    if not isinstance(done, np.ndarray):
        import ray

        done = ray.get(done)
    if done.size == 0 or batch.num_rows == 0:
        return batch
    ids = batch[column]
    valid = pc.is_valid(ids).to_numpy(zero_copy_only=False)
    found = np.zeros(batch.num_rows, dtype=bool)
    if valid.any():
        keys = digests(ids)
        at = np.minimum(np.searchsorted(done, keys), done.size - 1)
        found[np.flatnonzero(valid)] = done[at] == keys
    return batch.filter(pa.array(~found))


@dataclass(frozen=True)
class OutputState:
    """An output folder prepared for a run: this run's id, what was already there."""

    root: str
    ray_path: str
    fs: pafs.FileSystem
    run_id: str
    files_before: tuple[str, ...]
    rows_before: int
    removed_incomplete: tuple[str, ...]
    written: Any  # ObjectRef of the sorted digest array, or None when nothing is written yet


def check_manifest(fs: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> None:
    """Record what writes this folder; refuse to mix with rows written under other settings."""
    path = posixpath.join(root, MANIFEST)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        with fs.open_input_stream(path) as f:
            saved = json.loads(f.read().decode("utf-8"))
        differ = sorted(k for k in set(saved) | set(manifest) if saved.get(k) != manifest.get(k))
        if differ:
            details = ", ".join(f"{k}: {saved.get(k)!r} -> {manifest.get(k)!r}" for k in differ)
            raise ValueError(
                f"output {root} was written by another job configuration ({details}); "
                "use a new output path, or delete this one to start over"
            )
        return
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))


def prepare_output(output: str, manifest: dict[str, Any], column: str = "search_id") -> OutputState:
    """Check the manifest, delete incomplete part files, start the done-set task.

    Needs a connected Ray (the done set is computed by a Ray task).
    """
    import ray

    fs, root, ray_path = resolve(output)
    existing = part_files(fs, root)
    if existing and fs.get_file_info(posixpath.join(root, MANIFEST)).type != pafs.FileType.File:
        raise ValueError(
            f"output {root} holds {len(existing)} Parquet files but no {MANIFEST}: "
            "not written by an acare job; use a new output path"
        )
    check_manifest(fs, root, manifest)
    complete, removed = [], []
    for path in existing:
        (complete if readable(fs, path) else removed).append(path)
    for path in removed:
        log.warning("removing incomplete part file %s (its rows are written again)", path)
        fs.delete_file(path)
    rows_before = sum(_num_rows(fs, path) for path in complete)
    written = None
    if complete:
        task = ray.remote(num_cpus=0)(_written_digests)
        written = task.remote(fs, complete, column)
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    return OutputState(
        root, ray_path, fs, run_id, tuple(complete), rows_before, tuple(removed), written
    )


def _num_rows(fs: pafs.FileSystem, path: str) -> int:
    with fs.open_input_file(path) as f:
        return pq.ParquetFile(f).metadata.num_rows


def tally(fs: pafs.FileSystem, files: list[str], key: str) -> dict[str, dict[str, int]]:
    """Per value of string column ``key``: ``rows`` and ``errored`` (rows with ``error`` set),
    reading two columns one file at a time."""
    out: dict[str, dict[str, int]] = {}
    for path in files:
        with fs.open_input_file(path) as f:
            table = pq.read_table(f, columns=[key, "error"])
        table = table.append_column("errored", pc.cast(pc.is_valid(table["error"]), pa.int64()))
        grouped = table.group_by(key).aggregate([("errored", "sum"), ("errored", "count")])
        for item in grouped.to_pylist():
            entry = out.setdefault(str(item[key]), {"rows": 0, "errored": 0})
            entry["rows"] += item["errored_count"]
            entry["errored"] += item["errored_sum"]
    return out
