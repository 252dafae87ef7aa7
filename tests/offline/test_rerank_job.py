"""The rerank job on a real local Ray cluster: no lost rows, resume, killed actors."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.cloudpickle
from offline_support import read_rows

from acare_ray.offline.actor import ScorerActor
from acare_ray.offline.job import ActorPool, ScorerSettings, run_job
from acare_ray.offline.rerank import RerankConfig, run
from acare_ray.offline.resume import MANIFEST, part_files, resolve
from acare_ray.schema import parse_search

pytestmark = pytest.mark.slow

# Workers cannot import this test module; ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

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
    from acare_ray.scorer import Scorer

    scorer = Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", **SETTINGS.options())
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
    fs, root, _ = resolve(str(out))
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
    fs, root, _ = resolve(str(out))
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


class KillOnce(ScorerActor):
    """Kills its own process (SIGKILL, no cleanup) on its second batch, once per job."""

    def __init__(self, marker: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == 2:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return super().__call__(batch)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(batch)


def test_killed_actor_mid_job_still_yields_every_row_exactly_once(
    ray_local, mixed_searches, tiny_qwen3_dir, tmp_path
):
    path, rows, errors = mixed_searches
    marker = tmp_path / "killed"
    counts = run_job(
        "rerank",
        str(path),
        str(tmp_path / "out"),
        KillOnce,
        {
            "marker": str(marker),
            "model": str(tiny_qwen3_dir),
            "modes": ("M0",),
            "scorer_options": SETTINGS.options(),
        },
        ActorPool(min_size=1, max_size=1, batch_size=2, rows_per_file=100),
        manifest={"test": "kill"},
        key_column="mode",
    )
    assert marker.exists()
    ids = [r["search_id"] for r in read_rows(tmp_path / "out")]
    assert sorted(ids) == sorted(r["search_id"] for r in rows)
    assert counts.written == len(rows) and counts.errored == len(errors)
