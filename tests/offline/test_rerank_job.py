"""The rerank job on a real local Ray cluster: no lost rows, resume, killed actors."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import offline_support
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.cloudpickle
from offline_support import FlakyFS, invalid_utf8, read_rows

from acare_ray.data.io import write_parquet
from acare_ray.data.schema import parse_search
from acare_ray.data.synthetic import SYNTHETIC_SEARCHES
from acare_ray.offline import resume
from acare_ray.offline.actor import ScorerActor
from acare_ray.offline.job import ActorPool, Job, actor_scorer, run_job
from acare_ray.offline.lock import LOCK_FILE, OutputLock
from acare_ray.offline.rerank import RerankConfig, run
from acare_ray.offline.resume import MANIFEST, part_files, storage_paths
from acare_ray.scoring import Scorer, ScorerSettings

pytestmark = pytest.mark.slow

# Workers cannot import this test module; ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(offline_support)

SETTINGS = ScorerSettings(max_length=1024)
POOL = ActorPool(min_size=1, max_size=2, batch_size=3, rows_per_file=1)


def config(data, out: Path, **changes) -> RerankConfig:
    path, _, _ = data
    fields = dict(input=str(path), output=str(out), model="", mode="M3", pool=POOL, scorer=SETTINGS)
    return RerankConfig(**(fields | changes))


@pytest.fixture(scope="module")
def first_run(ray_local, mixed_searches, tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rerank") / "out"
    counts = run(config(mixed_searches, out, model=str(tiny_qwen3_dir)))
    return out, counts


def test_rows_in_equal_rows_out_and_bad_rows_carry_their_error(first_run, mixed_searches):
    out, counts = first_run
    _, rows, errors = mixed_searches
    written = read_rows(out)
    assert sorted(r["search_id"] for r in written) == sorted(r["search_id"] for r in rows)
    assert (counts.rows_in, counts.written, counts.errored) == (len(rows), len(rows), len(errors))
    assert counts.scored == len(rows) - len(errors) and counts.per_key == {
        "M3": {"rows": len(rows), "errored": len(errors)}
    }
    for row in written:
        if row["search_id"] in errors:
            assert errors[row["search_id"]] in row["error"] and row["ranking"] == []
        else:
            assert row["error"] is None and row["mode"] == "M3"
    huge = next(r for r in written if r["search_id"].endswith("-huge"))
    assert len(huge["ranking"]) == 20


def test_scores_written_by_the_job_equal_scorer_score(first_run, mixed_searches, tiny_qwen3_dir):
    scorer = Scorer.from_settings(str(tiny_qwen3_dir), SETTINGS, device="cpu")
    out, _ = first_run
    _, rows, errors = mixed_searches
    written = {r["search_id"]: r for r in read_rows(out)}
    for row in rows:
        if row["search_id"] in errors:
            continue
        search = parse_search(row)
        direct = scorer.score(search.context, [c.text for c in search.candidates], "M3")
        ranking = written[search.search_id]["ranking"]
        by_doc = {r["doc_id"]: r["score"] for r in ranking}
        got = np.array([by_doc[c.doc_id] for c in search.candidates], dtype=np.float32)
        np.testing.assert_allclose(got, direct, atol=1e-5, rtol=0)
        scores = [r["score"] for r in ranking]
        assert scores == sorted(scores, reverse=True)


def test_second_run_over_the_same_output_writes_nothing_new(
    first_run, tiny_qwen3_dir, mixed_searches
):
    out, first = first_run
    fs, root, _ = storage_paths(str(out))
    before = {p: os.path.getmtime(p) for p in part_files(fs, root)}
    again = run(config(mixed_searches, out, model=str(tiny_qwen3_dir)))
    assert (again.written, again.files_written) == (0, 0)
    assert again.already_written == first.written == again.output_rows
    assert {p: os.path.getmtime(p) for p in part_files(fs, root)} == before


def test_other_settings_cannot_resume_into_the_same_output(
    first_run, tiny_qwen3_dir, mixed_searches
):
    out, _ = first_run
    with pytest.raises(ValueError, match=r"modes: \['M3'\] -> \['M2'\]"):
        run(config(mixed_searches, out, model=str(tiny_qwen3_dir), mode="M2"))
    assert (out / MANIFEST).is_file()


def test_part_file_cut_short_is_rewritten_exactly_once(
    first_run, tiny_qwen3_dir, mixed_searches, tmp_path
):
    out = tmp_path / "out"
    shutil.copytree(first_run[0], out)
    fs, root, _ = storage_paths(str(out))
    files = part_files(fs, root)
    table = pa.concat_tables([pq.read_table(p) for p in files])
    half = table.num_rows // 2
    for path in files:
        Path(path).unlink()
    pq.write_table(table.slice(0, half), out / "earlier-run_a_000000-0.parquet")
    cut = out / "earlier-run_b_000000-0.parquet"
    pq.write_table(table.slice(half), cut)
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])  # its writer died mid-file: no footer
    counts = run(config(mixed_searches, out, model=str(tiny_qwen3_dir)))
    assert counts.removed_incomplete == 1 and not cut.exists()
    assert counts.already_written == half and counts.written == table.num_rows - half
    ids = [r["search_id"] for r in read_rows(out)]
    assert sorted(ids) == sorted(r["search_id"] for r in mixed_searches[1])


class KillOnceAndSpyBudget(ScorerActor):
    """Writes the object-store limit its job executes under to ``budget``, scores, and kills
    its own process (SIGKILL, no cleanup) on its second batch, once per job (``killed``)."""

    def __init__(self, budget: str, killed: str, **kwargs) -> None:
        super().__init__(**kwargs)
        from ray.data import DataContext

        limits = DataContext.get_current().execution_options.resource_limits
        Path(budget).write_text(str(limits.object_store_memory))
        self.killed = killed
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == 2:
            try:
                os.close(os.open(self.killed, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return super().__call__(batch)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(batch)


def test_killed_actor_mid_job_under_a_store_budget_yields_every_row_exactly_once(
    ray_local, mixed_searches, tiny_qwen3_dir, tmp_path
):
    """One job checks two things: it runs within its object-store budget (and restores the
    limits after), and its actor SIGKILLed mid-job loses and duplicates no row."""
    from ray.data import DataContext

    path, rows, errors = mixed_searches
    before = DataContext.get_current().execution_options.resource_limits
    budget, killed = tmp_path / "budget", tmp_path / "killed"
    job = Job(
        "rerank",
        str(path),
        str(tmp_path / "out"),
        KillOnceAndSpyBudget,
        actor_kwargs={
            "budget": str(budget),
            "killed": str(killed),
            "model": str(tiny_qwen3_dir),
            "modes": ("M0",),
            "scorer_options": actor_scorer(SETTINGS, None),
        },
        manifest={"test": "kill"},
        key_column="mode",
    )
    pool = ActorPool(min_size=1, max_size=1, batch_size=2, rows_per_file=100, object_store_mb=1)
    counts = run_job(job, pool)
    assert killed.exists()
    assert float(budget.read_text()) == 2**20  # object_store_mb=1
    ids = [r["search_id"] for r in read_rows(tmp_path / "out")]
    assert sorted(ids) == sorted(r["search_id"] for r in rows)
    assert counts.written == len(rows) and counts.errored == len(errors)
    assert DataContext.get_current().execution_options.resource_limits == before
    assert ActorPool().store_budget_bytes is None  # no cap unless asked


def test_resume_over_many_part_files_with_one_cut_mid_write(
    first_run, tiny_qwen3_dir, mixed_searches, tmp_path
):
    """The done set over many part files: the rows of the one cut short are scored again,
    nothing else, and every search ends up in the output exactly once."""
    out = tmp_path / "out"
    shutil.copytree(first_run[0], out)
    fs, root, _ = storage_paths(str(out))
    table = pa.concat_tables([pq.read_table(p) for p in part_files(fs, root)])
    for path in part_files(fs, root):
        Path(path).unlink()
    n_files = 8
    bounds = np.linspace(0, table.num_rows, n_files + 1).astype(int)
    for k in range(n_files):
        part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
        pq.write_table(part, out / f"earlier-run_w_{k:06d}-0.parquet")
    cut = out / f"earlier-run_w_{n_files // 2:06d}-0.parquet"
    lost = pq.ParquetFile(cut).metadata.num_rows
    assert 0 < lost < table.num_rows
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 3])  # its writer died mid-file: no footer
    counts = run(config(mixed_searches, out, model=str(tiny_qwen3_dir)))
    assert counts.removed_incomplete == 1 and not cut.exists()
    assert counts.already_written == table.num_rows - lost
    assert counts.written == lost  # only the cut file's rows were scored again
    ids = [r["search_id"] for r in read_rows(out)]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(r["search_id"] for r in mixed_searches[1])


def committed_rows(output: Path) -> int:
    total = 0
    for path in output.glob("*.parquet"):
        with contextlib.suppress(Exception):  # still being written: no footer yet
            total += pq.ParquetFile(path).metadata.num_rows
    return total


def test_killed_driver_resumes_with_every_search_exactly_once(ray_local, tiny_qwen3_dir, tmp_path):
    """``acare rerank`` SIGKILLed a third of the way in, then the same command again: every search once,
    and the re-run scores only what was not committed."""
    import subprocess
    import time

    from acare_ray.data.io import write_parquet
    from acare_ray.data.synthetic import synthetic_searches

    table = synthetic_searches(240, seed=5).slice(0, 480)
    write_parquet(table, tmp_path / "searches.parquet")
    output = tmp_path / "out"
    address = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "acare_ray.cli", "rerank"]
    command += ["--input", str(tmp_path / "searches.parquet"), "--output", str(output)]
    command += ["--model", str(tiny_qwen3_dir), "--mode", "M0", "--actors", "1"]
    command += ["--batch-size", "16", "--rows-per-file", "64"]
    command += ["--ray-address", address]
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    while committed_rows(output) < 160:
        assert driver.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    committed = committed_rows(output)
    assert committed < table.num_rows

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = re.search(r"written (\d+) .*skipped as already written (\d+);", done.stdout)
    assert summary, done.stdout
    written, already = int(summary.group(1)), int(summary.group(2))
    # The re-run found what the killed one committed (at least what was there when it died)
    # and scored exactly the rest: nothing written is scored again.
    assert already >= committed
    assert written == table.num_rows - already
    ids = [r["search_id"] for r in read_rows(output)]
    assert len(ids) == len(set(ids)) == table.num_rows
    assert set(ids) == set(table.column("search_id").to_pylist())


def test_rerank_uses_the_fusion_fitted_for_the_checkpoint_and_never_mixes_on_resume(
    ray_local, mixed_searches, tiny_qwen3_copy, tmp_path
):
    """Issue 20: the fitted setting stored with a checkpoint is what rerank uses by default."""
    from acare_ray.ranking.checkpoint_settings import write_fusion
    from acare_ray.ranking.fusion import FusionConfig, fuse

    fitted = FusionConfig("rrf", k=60, weight=0.3)
    write_fusion(tiny_qwen3_copy, fitted, {"objective": "nDCG@10"})
    out = tmp_path / "out"
    run(config(mixed_searches, out, model=str(tiny_qwen3_copy)))
    _, rows, errors = mixed_searches
    written = {r["search_id"]: r for r in read_rows(out)}
    for row in rows:
        got = written[row["search_id"]]
        assert got["fusion"] == fitted.label
        if row["search_id"] in errors:
            continue
        search = parse_search(row)
        by_doc = {r["doc_id"]: r for r in got["ranking"]}
        scores = [by_doc[c.doc_id]["score"] for c in search.candidates]
        expected = fuse(scores, fitted, [c.first_stage_score for c in search.candidates])
        assert [r["doc_id"] for r in got["ranking"]] == [
            search.candidates[i].doc_id for i in expected.order
        ]
        assert [by_doc[c.doc_id]["fused"] for c in search.candidates] == pytest.approx(
            expected.values.tolist()
        )
    with pytest.raises(ValueError, match=r"fusion: 'rrf:k=60,weight=0.3' -> None"):
        run(config(mixed_searches, out, model=str(tiny_qwen3_copy), fusion="none"))


def cli_rerank(data_path, output: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    """``acare rerank`` (the settings of :func:`config`) in a fresh interpreter on this cluster."""
    command = [sys.executable, "-m", "acare_ray.cli", "rerank", "--input", str(data_path)]
    command += ["--output", str(output), "--model", str(model), "--mode", "M3"]
    command += ["--actors", "1,2", "--batch-size", "3", "--rows-per-file", "1"]
    command += ["--ray-address", ray.get_runtime_context().gcs_address, *extra]
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_transient_read_error_bad_utf8_cell_and_second_job_lose_and_duplicate_nothing(
    first_run, mixed_searches, tiny_qwen3_dir, tmp_path, monkeypatch
):
    """Issue 21 part 5, end to end. Before: a transient OSError reading a part file deleted
    it, a second job on the same output could delete the first one's files, and one
    sub-query that is not valid UTF-8 failed the job on every rerun.

    Setup: an interrupted output (the first run's, every other part file gone) and an input
    with one more search whose ``sub_query`` is Latin-1. A second job (``acare rerank`` in a
    subprocess) is started while this test holds the output's lock: it must refuse, naming the
    holder, and touch nothing. Then the job runs with the output's file system wrapped in
    ``FlakyFS`` so that its first two file reads raise ``OSError`` (deterministic; fewer than
    ``READ_ATTEMPTS``): nothing may be deleted, every search comes out once, the bad cell's
    row carries the error naming it."""
    monkeypatch.setattr(resume, "RETRY_DELAY_S", 0.0)
    _, rows, errors = mixed_searches
    latin1 = copy.deepcopy(rows[0]) | {"search_id": f"{rows[0]['search_id']}-latin1"}
    searches = pa.Table.from_pylist([*rows, latin1], schema=SYNTHETIC_SEARCHES)
    queries = [q.encode() if q is not None else None for q in searches["sub_query"].to_pylist()]
    queries[-1] = b"caf\xe9 au lait"
    column = searches.schema.get_field_index("sub_query")
    searches = searches.set_column(column, "sub_query", invalid_utf8(queries))
    write_parquet(searches, tmp_path / "in" / "searches.parquet")

    out = tmp_path / "out"
    shutil.copytree(first_run[0], out)
    fs, root, _ = storage_paths(str(out))
    for path in part_files(fs, root)[::2]:
        Path(path).unlink()
    kept = {p: os.path.getmtime(p) for p in part_files(fs, root)}
    kept_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in kept)

    with OutputLock(fs, root, "first-job"):
        second = cli_rerank(tmp_path / "in", out, tiny_qwen3_dir)
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"is locked by run first-job (pid {os.getpid()}" in second.stderr
    assert {p: os.path.getmtime(p) for p in part_files(fs, root)} == kept
    assert not (out / LOCK_FILE).exists()

    flaky = FlakyFS(failures=2)
    real_resolve = storage_paths
    monkeypatch.setattr(
        resume, "storage_paths", lambda p: (flaky, root, p) if p == str(out) else real_resolve(p)
    )
    counts = run(config(mixed_searches, out, model=str(tiny_qwen3_dir), input=str(tmp_path / "in")))
    assert flaky.failures == 0  # both injected errors were hit
    assert counts.removed_incomplete == 0 and all(Path(p).exists() for p in kept)
    assert counts.already_written == kept_rows
    assert counts.rows_in == counts.output_rows == len(rows) + 1
    assert counts.written == counts.rows_in - kept_rows
    written = {r["search_id"]: r for r in read_rows(out)}
    assert len(read_rows(out)) == len(written) == counts.rows_in
    assert set(written) == set(searches["search_id"].to_pylist())
    bad = written[latin1["search_id"]]
    assert bad["error"] == f"search_id={latin1['search_id']}: sub_query is not valid UTF-8"
    for search_id, fragment in errors.items():
        assert fragment in written[search_id]["error"]
    assert sum(r["error"] is not None for r in written.values()) == len(errors) + 1
    assert not (out / LOCK_FILE).exists()


def test_retry_errors_rescores_errored_searches_exactly_once(
    first_run, mixed_searches, tiny_qwen3_dir, tmp_path
):
    """Before: a search whose row errored (say a transient scoring failure) stayed errored
    on every rerun. ``--retry-errors`` scores each errored search again and replaces its row:
    rows in == rows out, the once-failed search now scored, the invalid rows errored again."""
    out = tmp_path / "out"
    shutil.copytree(first_run[0], out)
    fs, root, _ = storage_paths(str(out))
    _, rows, errors = mixed_searches
    victim = next(r["search_id"] for r in rows if r["search_id"] not in errors)
    for path in part_files(fs, root):
        table = pq.read_table(path)
        if victim in table["search_id"].to_pylist():
            failed = [
                r | {"ranking": [], "error": f"search_id={victim}: scoring failed: OOM"}
                if r["search_id"] == victim
                else r
                for r in table.to_pylist()
            ]
            pq.write_table(pa.Table.from_pylist(failed, schema=table.schema), path)
    counts = run(config(mixed_searches, out, model=str(tiny_qwen3_dir), retry_errors=True))
    retried = len(errors) + 1
    assert counts.retried == counts.written == retried
    assert (counts.errored, counts.already_written) == (len(errors), len(rows) - retried)
    assert counts.output_rows == counts.rows_in == len(rows)
    written = read_rows(out)
    ids = [r["search_id"] for r in written]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(r["search_id"] for r in rows)
    by_id = {r["search_id"]: r for r in written}
    assert by_id[victim]["error"] is None and len(by_id[victim]["ranking"]) == 20
    assert all(fragment in by_id[i]["error"] for i, fragment in errors.items())
