"""Resume logic without Ray: what counts as a broken part file, transient read errors, the
output lock, retrying errored rows and cells that are not valid UTF-8.

Transient errors are injected with ``offline_support.FlakyFS``, a wrapper around the local
file system whose first ``failures`` ``open_input_file`` calls raise ``OSError`` (what an
object store's dropped connection or throttling surfaces as in pyarrow), deterministically.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from offline_support import FlakyFS, invalid_utf8

from acare_ray.data.schema import RERANK_OUTPUT
from acare_ray.offline import resume
from acare_ray.offline.lock import LOCK_FILE, OutputLock, OutputLocked
from acare_ray.offline.resume import (
    MANIFEST,
    StorageError,
    complete_rows,
    digests,
    found,
    part_files,
    prepare_output,
    strip_errored,
)
from acare_ray.offline.score import rerank_rows, table_rows


@pytest.fixture(autouse=True)
def no_retry_wait(monkeypatch):
    monkeypatch.setattr(resume, "RETRY_DELAY_S", 0.0)


def output_rows(ids: list[str], errors: dict[str, str] | None = None) -> pa.Table:
    errors = errors or {}
    rows = [
        {
            "search_id": i,
            "mode": "M0",
            "ranking": [] if i in errors else [{"doc_id": "d", "score": 1.0, "rank": 1}],
            "error": errors.get(i),
        }
        for i in ids
    ]
    return pa.Table.from_pylist(rows, schema=RERANK_OUTPUT)


def make_output(root: Path, parts: list[pa.Table]) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps({"job": "test"}))
    for k, table in enumerate(parts):
        pq.write_table(table, root / f"earlier_w_{k:06d}-0.parquet")
    return part_files(pafs.LocalFileSystem(), str(root))


def test_transient_read_error_is_retried_and_the_file_counts_as_complete(tmp_path):
    """Pins: resume took any OSError on a part file for a broken file and deleted it."""
    (path,) = make_output(tmp_path / "out", [output_rows(["a", "b", "c"])])
    fs = FlakyFS(failures=resume.READ_ATTEMPTS - 1)
    assert complete_rows(fs, path) == 3
    assert fs.failures == 0


def test_persistent_read_error_fails_loudly_and_deletes_nothing(tmp_path, monkeypatch):
    """Pins: a read error that did not go away deleted the part file (and so its rows'
    work); now the job stops with StorageError naming the file and every file stays."""
    out = tmp_path / "out"
    files = make_output(out, [output_rows(["a", "b"]), output_rows(["c"])])
    flaky = FlakyFS(failures=10**6)
    monkeypatch.setattr(resume, "storage_paths", lambda p: (flaky, str(out), str(out)))
    with pytest.raises(
        StorageError, match=r"footer of .*earlier_w_000000-0.parquet.*nothing was deleted"
    ):
        prepare_output(str(out), {"job": "test"})
    assert part_files(pafs.LocalFileSystem(), str(out)) == files


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # writer died mid-file
        lambda data: data[:-1],  # last byte of the magic missing
        lambda data: data[:-8] + b"\xff\xff\x00\x00PAR1",  # footer length past the file
        lambda data: data[:4] + b"\x00" * (len(data) - 12) + data[-8:],  # footer is zeros
        lambda data: b"",
    ],
    ids=["cut-half", "cut-magic", "bad-length", "zeroed-footer", "empty"],
)
def test_a_file_whose_footer_bytes_do_not_parse_is_proved_broken(tmp_path, damage):
    (path,) = make_output(tmp_path / "out", [output_rows(["a", "b"])])
    Path(path).write_bytes(damage(Path(path).read_bytes()))
    assert complete_rows(pafs.LocalFileSystem(), path) is None


def test_a_parquet_file_without_the_id_column_is_proved_broken(tmp_path):
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), path)
    assert complete_rows(pafs.LocalFileSystem(), str(path)) is None
    assert complete_rows(pafs.LocalFileSystem(), str(path), column="x") == 2


def test_retry_errors_removes_every_row_of_an_errored_search_once(tmp_path):
    """Pins: errored rows were never retried. Every mode's row of a search with an error row
    goes (so the search is rescored whole), files are replaced in place, the rest stays."""
    out = tmp_path / "out"
    both_modes = pa.concat_tables(
        [output_rows(["a", "b"]), output_rows(["b"]).set_column(1, "mode", pa.array(["M3"]))]
    )
    errored = output_rows(["c", "d"], errors={"d": "search_id=d: scoring failed"})
    b_failed = output_rows(["b"], errors={"b": "search_id=b: scoring failed"})
    files = make_output(out, [both_modes, errored, b_failed])
    fs = pafs.LocalFileSystem()
    rows = {p: complete_rows(fs, p) for p in files}
    removed, after = strip_errored(fs, str(out), rows)
    assert removed == 4  # b (M0), b (M3), b (error), d
    kept = {p: pq.read_table(p)["search_id"].to_pylist() for p in part_files(fs, str(out))}
    assert kept == {files[0]: ["a"], files[1]: ["c"]}
    assert after == {files[0]: 1, files[1]: 1}
    assert not [p for p in os.listdir(out) if p.startswith(resume.REWRITE_PREFIX)]
    assert strip_errored(fs, str(out), after) == (0, after)  # nothing left to retry


def test_digests_of_ids_that_are_not_valid_utf8_match_their_escaped_text():
    """Pins: one invalid UTF-8 id failed the done set (and so every rerun). The error row
    writes the id escaped; its digest matches the raw id's, so resume skips it."""
    raw = invalid_utf8([b"ok", b"bad\xff", None])
    escaped = pa.array(["ok", "bad\\xff"])
    assert digests(raw).tolist() == digests(escaped).tolist()
    done = np.unique(digests(escaped))
    assert found(raw, done).tolist() == [True, True, False]


def test_a_cell_that_is_not_valid_utf8_fails_only_its_row(tiny_scorer):
    """Pins: ``batch.to_pylist()`` raised UnicodeDecodeError for the whole batch (and the
    job, on every rerun). Now the row gets an error naming the cell and the others score."""
    from acare_ray.data.synthetic import SYNTHETIC_SEARCHES, synthetic_searches

    table = synthetic_searches(3, seed=1).cast(SYNTHETIC_SEARCHES).slice(0, 3)
    assert table.num_rows == 3
    queries = [q.encode() for q in table["sub_query"].to_pylist()]
    queries[1] = b"caf\xe9 menu"  # Latin-1, not UTF-8
    table = table.set_column(2, "sub_query", invalid_utf8(queries))
    rows = table_rows(table)
    out = rerank_rows(tiny_scorer, rows, ["M0"])
    bad_id = table["search_id"][1].as_py()
    assert out[1]["search_id"] == bad_id and out[1]["ranking"] == []
    assert out[1]["error"] == f"search_id={bad_id}: sub_query is not valid UTF-8"
    assert [r["error"] for r in (out[0], out[2])] == [None, None]
    assert all(r["ranking"] for r in (out[0], out[2]))


def test_a_bad_candidate_text_is_named_with_its_index():
    from acare_ray.data.synthetic import SYNTHETIC_SEARCHES, synthetic_searches

    table = synthetic_searches(1, seed=1).cast(SYNTHETIC_SEARCHES).slice(0, 1)
    row = table.to_pylist()[0]
    texts = [c["text"].encode() for c in row["candidates"]]
    texts[2] = b"\xff"
    candidates = table["candidates"].combine_chunks()
    structs = candidates.values
    names = [f.name for f in structs.type]
    fields = [structs.field(n) for n in names]
    fields[names.index("text")] = invalid_utf8(texts)
    new_structs = pa.StructArray.from_arrays(fields, fields=list(structs.type))
    new_candidates = pa.ListArray.from_arrays(candidates.offsets, new_structs)
    table = table.set_column(
        table.schema.get_field_index("candidates"), "candidates", new_candidates
    )
    (bad,) = table_rows(table)
    assert str(bad) == f"search_id={row['search_id']}: candidates[2].text is not valid UTF-8"


def test_a_second_job_on_a_locked_output_is_refused_with_the_holder_named(tmp_path):
    """Pins: nothing stopped a second job on the same output from deleting the first one's
    files. The lock is exclusive, names its holder, and is removed on release."""
    fs = pafs.LocalFileSystem()
    root = str(tmp_path / "out")
    with OutputLock(fs, root, "first-run"):
        assert json.loads((tmp_path / "out" / LOCK_FILE).read_text())["run_id"] == "first-run"
        with pytest.raises(OutputLocked, match=rf"locked by run first-run \(pid {os.getpid()}"):
            OutputLock(fs, root, "second-run").acquire()
    assert not (tmp_path / "out" / LOCK_FILE).exists()
    with OutputLock(fs, root, "third-run"):  # free again
        pass


def test_the_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
    fs = pafs.LocalFileSystem()
    root = str(tmp_path / "out")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    OutputLock(fs, root, "killed-run").acquire()  # never released, as after SIGKILL
    lock = tmp_path / "out" / LOCK_FILE
    holder = json.loads(lock.read_text()) | {"pid": int(dead.stdout)}
    lock.write_text(json.dumps(holder))
    with OutputLock(fs, root, "next-run"):
        assert json.loads(lock.read_text())["run_id"] == "next-run"
    shutil.rmtree(root)


def test_eval_reads_labels_and_first_stage_around_a_cell_that_is_not_utf8(tmp_path):
    """Pins a gap left by the per-row UTF-8 fix: ``acare eval`` read the input's ids and labels
    with a plain ``to_pylist``, so one bad ``search_id`` or ``doc_id`` failed the evaluation
    after scoring. Those values now come back escaped (``canonical_id`` form, as the search's
    error row names it) and every other search is read as before."""
    import pyarrow.parquet as pq

    from acare_ray.offline.evaluate import load_first_stage, load_qrels

    ids = invalid_utf8([b"good", b"bad\xff"])
    doc_ids = invalid_utf8([b"a", b"b", b"c\xfe", b"d"])
    candidates = pa.ListArray.from_arrays(
        pa.array([0, 2, 4], pa.int32()),
        pa.StructArray.from_arrays(
            [doc_ids, pa.array(["A", "B", "C", "D"]), pa.array([1, 0, 1, 0], pa.int32())],
            names=["doc_id", "text", "relevance"],
        ),
    )
    pq.write_table(pa.table({"search_id": ids, "candidates": candidates}), tmp_path / "in.parquet")
    qrels = load_qrels(str(tmp_path / "in.parquet"))
    assert qrels == {"good": {"a": 1, "b": 0}, "bad\\xff": {"c\\xfe": 1, "d": 0}}
    first = load_first_stage(str(tmp_path / "in.parquet"))
    assert first["good"][0] == ["a", "b"] and first["bad\\xff"][0] == ["c\\xfe", "d"]
