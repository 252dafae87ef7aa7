"""Resumable output folders: the output itself says which searches are done.

An output folder holds the Parquet part files the jobs write, named
``{run_id}_{write_uuid}_{task:06}-{i}.parquet``, and ``_acare_job.json`` (what wrote them:
job, model, modes, ...; readers skip files starting with ``_``). There is no separate
checkpoint to lose or to fall out of step with the data:

- **Commit marker.** A Parquet footer is written last and a file cannot be opened without it,
  so a part file whose footer reads holds all of its rows. A part file is deleted before a
  run only when it is *proved* broken: its footer bytes were read and do not parse (no
  ``PAR1`` magic, metadata that does not deserialize, no ``search_id`` column, column chunks
  past the footer). A read that fails (``OSError``: a network or object-store hiccup) proves
  nothing: it is retried :data:`READ_ATTEMPTS` times and then fails the job with
  :class:`StorageError`, deleting nothing.
- **Lock.** The caller holds the folder's :class:`~acare_ray.offline.lock.OutputLock` while
  it prepares and writes, so no second job deletes or duplicates this one's files.
- **Retrying errored rows** (``retry_errors``): before the done set is computed, every row of
  a search that has an error row is removed from the part files (each file rewritten to a
  ``_`` temp file and moved over the original), so those searches count as not written and
  are scored again, once. A crash in between only leaves them missing for the next run.
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
An id that is not valid UTF-8 is matched by its text with the bad bytes escaped
(``backslashreplace``), the form the error row writes it in.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

MANIFEST = "_acare_job.json"
DIGEST_DTYPE = np.dtype("S16")
READ_ATTEMPTS = 4
RETRY_DELAY_S = 0.5
"""Reads of the output folder are tried this many times, waiting 0.5, 1, 2 s in between."""
REWRITE_PREFIX = "_retry-"

T = TypeVar("T")


class StorageError(OSError):
    """A read of the output folder kept failing; nothing was deleted."""


def retried(what: str, read: Callable[[], T]) -> T:
    """``read()``, tried again on ``OSError`` up to :data:`READ_ATTEMPTS` times in all; then
    :class:`StorageError` naming ``what``. Other exceptions pass through at once."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            return read()
        except StorageError:
            raise
        except OSError as err:
            if attempt == READ_ATTEMPTS:
                raise StorageError(
                    f"{what}: failed {READ_ATTEMPTS} times, last {type(err).__name__}: {err}; "
                    "nothing was deleted: run the job again when the storage answers"
                ) from err
            log.warning("%s failed (%s: %s); trying again", what, type(err).__name__, err)
            time.sleep(RETRY_DELAY_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def storage_paths(path: str) -> tuple[pafs.FileSystem, str, str]:
    """``(filesystem, path inside it, path for Ray)``; a plain path is made absolute."""
    if "://" not in path:
        path = os.path.abspath(path)
        return pafs.LocalFileSystem(), path, path
    fs, inner = pafs.FileSystem.from_uri(path)
    return fs, inner, path


def part_files(fs: pafs.FileSystem, root: str) -> list[str]:
    """Parquet part files under ``root`` (sorted; hidden and ``_`` files excluded)."""
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    infos = retried(f"listing {root}", lambda: fs.get_file_info(selector))
    return sorted(
        info.path
        for info in infos
        if info.type == pafs.FileType.File
        and info.path.endswith(".parquet")
        and not posixpath.basename(info.path).startswith(("_", "."))
    )


def _read_footer(fs: pafs.FileSystem, path: str) -> tuple[int, bytes]:
    """``(file size, footer)``: the metadata, its length and the ``PAR1`` magic, or the last
    bytes when the trailer does not describe a footer. A short read raises ``OSError``."""

    def exactly(f: Any, n: int) -> bytes:
        data = f.read(n)
        if len(data) != n:
            raise OSError(f"short read: {len(data)} of {n} bytes")
        return data

    with fs.open_input_file(path) as f:
        size = f.size()
        if size < 12:
            return size, exactly(f, size)
        f.seek(size - 8)
        tail = exactly(f, 8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or length > size - 12:
            return size, tail
        f.seek(size - 8 - length)
        return size, exactly(f, length + 8)


def footer_problem(size: int, footer: bytes, column: str) -> str | None:
    """Why the footer bytes of a part file of ``size`` bytes prove it broken, else None.

    Pure: it parses bytes already read, so no I/O error can make a good file look broken.
    """
    if len(footer) < 12 or footer[-4:] != b"PAR1":
        return "no Parquet footer (its writer died mid-file)"
    try:
        meta = pq.ParquetFile(pa.BufferReader(b"PAR1" + footer)).metadata
    except Exception as err:  # noqa: BLE001 - any parse failure of read bytes is proof
        return f"its footer does not parse ({type(err).__name__}: {err})"
    if column not in meta.schema.names:
        return f"it has no {column} column"
    data_end = size - len(footer)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
            start = min(start or chunk.data_page_offset, chunk.data_page_offset)
            if start + chunk.total_compressed_size > data_end:
                return f"row group {g} column {chunk.path_in_schema} ends past the data"
    return None


def complete_rows(fs: pafs.FileSystem, path: str, column: str = "search_id") -> int | None:
    """Rows of the part file at ``path``; None when it is proved broken (see
    :func:`footer_problem`). A read that keeps failing raises :class:`StorageError`."""
    size, footer = retried(f"reading the footer of {path}", lambda: _read_footer(fs, path))
    problem = footer_problem(size, footer, column)
    if problem is not None:
        log.warning("part file %s is broken: %s", path, problem)
        return None
    return pq.ParquetFile(pa.BufferReader(b"PAR1" + footer)).metadata.num_rows


def _read(fs: pafs.FileSystem, path: str, columns: list[str] | None) -> pa.Table:
    def read() -> pa.Table:
        with fs.open_input_file(path) as f:
            return pq.read_table(f, columns=columns)

    return retried(f"reading {path}", read)


def canonical_id(raw: bytes) -> str:
    """An id as text: its UTF-8, with bytes that are not valid UTF-8 escaped (``\\xff``)."""
    return raw.decode("utf-8", errors="backslashreplace")


def digests(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """128-bit BLAKE2b digest of each non-null id, as ``S16`` (nulls are dropped).

    An id that is not valid UTF-8 is hashed as its :func:`canonical_id`."""
    ids = pc.drop_null(ids)
    try:
        values = [value.encode("utf-8") for value in ids.to_pylist()]
    except UnicodeDecodeError:
        raw = pc.cast(ids, pa.binary()).to_pylist()
        values = [canonical_id(value).encode("utf-8") for value in raw]
    out = np.empty(len(values), dtype=DIGEST_DTYPE)
    for i, value in enumerate(values):
        out[i] = hashlib.blake2b(value, digest_size=16).digest()
    return out


def _written_digests(fs: pafs.FileSystem, files: list[str], column: str) -> np.ndarray:
    parts = []
    for path in files:
        try:
            parts.append(digests(_read(fs, path, [column])[column]))
        except pa.ArrowInvalid as err:
            raise ValueError(
                f"part file {path} has a footer but its {column} column does not read ({err}); "
                "move the file out of the folder to score its rows again"
            ) from err
    if not parts:
        return np.empty(0, dtype=DIGEST_DTYPE)
    return np.unique(np.concatenate(parts))


def found(ids: pa.Array | pa.ChunkedArray, done: np.ndarray) -> np.ndarray:
    """Per row, whether its id's digest is in the sorted digest array ``done`` (null: False)."""
    present = np.zeros(len(ids), dtype=bool)
    if done.size == 0 or len(ids) == 0:
        return present
    valid = pc.is_valid(ids).to_numpy(zero_copy_only=False)
    if valid.any():
        keys = digests(ids)
        at = np.minimum(np.searchsorted(done, keys), done.size - 1)
        present[np.flatnonzero(valid)] = done[at] == keys
    return present


def _unwritten_rows(fs: pafs.FileSystem, files: list[str], column: str, done: np.ndarray) -> int:
    remaining = 0
    for path in files:
        table = _read(fs, path, [column])
        remaining += skip_written(table, [done], column).num_rows
    return remaining


def unwritten_rows(input_path: str, written: Any, column: str = "search_id") -> int:
    """How many input rows a run would score: rows whose id is null or not yet written.

    Reads only the id column, in a Ray task; lets a finished job return without starting
    its actors."""
    import ray

    fs, root, _ = storage_paths(input_path)
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
    return batch.filter(pa.array(~found(batch[column], done)))


@dataclass(frozen=True)
class OutputState:
    """An output folder prepared for a run: this run's id, what was already there.

    ``removed_incomplete``: part files proved broken and deleted; ``retried``: rows removed
    so that their searches are scored again (``retry_errors``)."""

    root: str
    ray_path: str
    fs: pafs.FileSystem
    run_id: str
    files_before: tuple[str, ...]
    rows_before: int
    removed_incomplete: tuple[str, ...]
    written: Any  # ObjectRef of the sorted digest array, or None when nothing is written yet
    retried: int = 0


def check_manifest(fs: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> None:
    """Record what writes this folder; refuse to mix with rows written under other settings."""
    path = posixpath.join(root, MANIFEST)
    info = retried(f"reading {path}", lambda: fs.get_file_info(path))
    if info.type == pafs.FileType.File:

        def read() -> bytes:
            with fs.open_input_stream(path) as f:
                return f.read()

        saved = json.loads(retried(f"reading {path}", read).decode("utf-8"))
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


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def prepare_output(
    output: str,
    manifest: dict[str, Any],
    column: str = "search_id",
    *,
    retry_errors: bool = False,
    run_id: str | None = None,
) -> OutputState:
    """Check the manifest, delete the part files proved broken, with ``retry_errors`` remove
    the rows of errored searches, then start the done-set task.

    Call it holding the folder's :class:`~acare_ray.offline.lock.OutputLock`. Needs a
    connected Ray (the done set is computed by a Ray task). A read that keeps failing raises
    :class:`StorageError` before anything is deleted.
    """
    import ray

    fs, root, ray_path = storage_paths(output)
    existing = part_files(fs, root)
    manifest_info = retried(
        f"listing {root}", lambda: fs.get_file_info(posixpath.join(root, MANIFEST))
    )
    if existing and manifest_info.type != pafs.FileType.File:
        raise ValueError(
            f"output {root} holds {len(existing)} Parquet files but no {MANIFEST}: "
            "not written by an acare job; use a new output path"
        )
    check_manifest(fs, root, manifest)
    rows = {path: complete_rows(fs, path, column) for path in existing}
    removed = [path for path, n in rows.items() if n is None]
    for path in removed:
        log.warning("removing broken part file %s (its rows are written again)", path)
        fs.delete_file(path)
    complete = {path: n for path, n in rows.items() if n is not None}
    dropped = 0
    if retry_errors:
        dropped, complete = strip_errored(fs, root, complete, column)
    written = None
    if complete:
        task = ray.remote(num_cpus=0)(_written_digests)
        written = task.remote(fs, list(complete), column)
    return OutputState(
        root,
        ray_path,
        fs,
        run_id or new_run_id(),
        tuple(complete),
        sum(complete.values()),
        tuple(removed),
        written,
        dropped,
    )


def strip_errored(
    fs: pafs.FileSystem, root: str, files: dict[str, int], column: str = "search_id"
) -> tuple[int, dict[str, int]]:
    """Remove every row of each search that has a row with ``error`` set (all its modes, so
    the search is scored again as a whole), and error rows without an id.

    ``files`` maps part files to their row counts. Each file that loses rows is written whole
    to a ``_retry-`` temp file in ``root`` and moved over the original (a rename on local
    disks: a reader sees the old file or the new one); a file left empty is deleted. Returns
    ``(rows removed, files -> rows after)``.
    """
    for info in retried(f"listing {root}", lambda: fs.get_file_info(pafs.FileSelector(root))):
        if posixpath.basename(info.path).startswith(REWRITE_PREFIX):
            fs.delete_file(info.path)  # left by a run that died while rewriting
    errored = []
    for path in files:
        table = _read(fs, path, [column, "error"])
        errored.append(digests(table.filter(pc.is_valid(table["error"]))[column]))
    bad = np.unique(np.concatenate(errored)) if errored else np.empty(0, DIGEST_DTYPE)
    after, removed = dict(files), 0
    for path in files:
        drop = _errored_rows(_read(fs, path, [column, "error"]), column, bad)
        if not drop.any():
            continue
        table = _read(fs, path, None)
        kept = table.filter(pa.array(~_errored_rows(table, column, bad)))
        removed += int(drop.sum())
        if kept.num_rows == 0:
            fs.delete_file(path)
            del after[path]
            continue
        temp = posixpath.join(root, f"{REWRITE_PREFIX}{uuid.uuid4().hex}.parquet")
        with fs.open_output_stream(temp) as out:
            pq.write_table(kept, out)
        fs.move(temp, path)
        after[path] = kept.num_rows
    if removed:
        log.info(
            "retry errors: removed %d rows of errored searches; they are scored again", removed
        )
    return removed, after


def _errored_rows(table: pa.Table, column: str, bad: np.ndarray) -> np.ndarray:
    """Rows whose id is in ``bad``, and error rows without an id."""
    no_id = pc.is_null(table[column]).to_numpy(zero_copy_only=False)
    has_error = pc.is_valid(table["error"]).to_numpy(zero_copy_only=False)
    return found(table[column], bad) | (no_id & has_error)


def tally(fs: pafs.FileSystem, files: list[str], key: str) -> dict[str, dict[str, int]]:
    """Per value of string column ``key``: ``rows`` and ``errored`` (rows with ``error`` set),
    reading two columns one file at a time."""
    out: dict[str, dict[str, int]] = {}
    for path in files:
        table = _read(fs, path, [key, "error"])
        table = table.append_column("errored", pc.cast(pc.is_valid(table["error"]), pa.int64()))
        grouped = table.group_by(key).aggregate([("errored", "sum"), ("errored", "count")])
        for item in grouped.to_pylist():
            entry = out.setdefault(str(item[key]), {"rows": 0, "errored": 0})
            entry["rows"] += item["errored_count"]
            entry["errored"] += item["errored_sum"]
    return out
