"""The one pipeline every offline job runs, and its settings.

``read_parquet -> skip rows already written -> map_batches(actor, ActorPoolStrategy) ->
write_parquet``, streaming: blocks flow through and are written as they come, so memory stays
flat as the input grows. Validation happens inside the actor's batch function (see
:mod:`acare_ray.offline.score`), row by row. A job ends with :class:`JobCounts`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from acare_ray.data.schema import SEARCHES
from acare_ray.offline.lock import OutputLock
from acare_ray.offline.resume import (
    OutputState,
    new_run_id,
    part_files,
    prepare_output,
    skip_written,
    storage_paths,
    tally,
    unwritten_rows,
)
from acare_ray.scoring import ScorerSettings

log = logging.getLogger(__name__)

BATCHES_PER_BLOCK = 4
# Ray Data reads Parquet footers on a pool of actors it builds for every read (2.60: 32 by
# default) and gives each a batch of 10 files; see ``footer_readers``.
FOOTER_READERS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
FILES_PER_FOOTER_READER = 10
MAX_FOOTER_READERS = 32
WORKER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class ActorPool:
    """Scorer actors: pool size bounds, resources per actor, searches per call.

    ``batch_size`` counts searches (each with all its candidates) per actor call;
    ``rows_per_file`` is the least number of output rows per Parquet part file;
    ``object_store_mb`` caps the object-store memory the job's blocks may hold at once
    (None: Ray Data's own limit, a share of the whole object store). A cap bounds how far
    reading runs ahead of the actors, at a price in throughput (docs/offline.md).
    """

    min_size: int = 1
    max_size: int = 2
    gpus_per_actor: float = 0.0
    cpus_per_actor: float = 1.0
    batch_size: int = 32
    rows_per_file: int = 2_000
    object_store_mb: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size:
            raise ValueError(
                f"actors: need 1 <= MIN <= MAX, got MIN={self.min_size}, MAX={self.max_size}"
            )
        if self.gpus_per_actor < 0 or self.cpus_per_actor < 0:
            raise ValueError("gpus_per_actor and cpus_per_actor must be >= 0")
        if self.batch_size < 1 or self.rows_per_file < 1:
            raise ValueError("batch_size and rows_per_file must be >= 1")
        if self.object_store_mb is not None and self.object_store_mb < 1:
            raise ValueError(f"object_store_mb must be >= 1, got {self.object_store_mb}")

    @property
    def store_budget_bytes(self) -> int | None:
        return None if self.object_store_mb is None else self.object_store_mb * 1024 * 1024

    @staticmethod
    def parse_sizes(text: str) -> tuple[int, int]:
        """``"2"`` -> (2, 2); ``"1,8"`` -> (1, 8)."""
        try:
            parts = [int(p) for p in text.split(",")]
        except ValueError:
            parts = []
        if len(parts) == 1:
            parts *= 2
        if len(parts) != 2:
            raise ValueError(f"actors must be N or MIN,MAX (integers), got {text!r}")
        return parts[0], parts[1]


def actor_scorer(settings: ScorerSettings, revision: str | None) -> dict[str, Any]:
    """What a job's actors load their scorer with, and its manifest records: the settings that
    differ from the defaults, and the model's revision when one is pinned. The actor pool
    places the model (an actor with a Ray GPU on CUDA, the others on CPU), so a ``device`` in
    the settings is refused."""
    if settings.device is not None:
        raise ValueError(
            "scorer.device: an offline job's actors run where the pool places them "
            "(--gpus-per-actor), not on a set device"
        )
    return settings.changed() | ({"revision": revision} if revision else {})


@dataclass(frozen=True)
class JobCounts:
    """How a job went. ``per_key`` maps each mode (rerank) or status (relabel) written this
    run to ``{"rows", "errored"}``. ``rows_in`` counts input rows, each of which yields
    ``rows_per_input`` output rows (one per mode); ``already_written`` counts the output rows
    found from earlier runs (their searches are skipped, not scored again); ``retried`` counts
    the rows of errored searches removed to be scored again (``retry_errors``)."""

    job: str
    output: str
    run_id: str
    rows_in: int
    already_written: int
    written: int
    errored: int
    output_rows: int
    files_written: int
    removed_incomplete: int
    wall_s: float
    rows_per_input: int = 1
    per_key: dict[str, dict[str, int]] = field(default_factory=dict)
    retried: int = 0

    @property
    def scored(self) -> int:
        return self.written - self.errored

    @property
    def expected_rows(self) -> int:
        return self.rows_in * self.rows_per_input

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "scored": self.scored, "expected_rows": self.expected_rows}

    def describe(self) -> str:
        text = (
            f"{self.job}: rows in {self.rows_in}, written {self.written} "
            f"(scored {self.scored}, errored {self.errored}), "
            f"skipped as already written {self.already_written}; "
            f"output holds {self.output_rows} of {self.expected_rows} expected rows "
            f"({self.output}), {self.wall_s:.1f} s"
        )
        if self.removed_incomplete:
            text += f"; removed {self.removed_incomplete} incomplete part files first"
        if self.retried:
            text += f"; removed {self.retried} rows of errored searches to score them again"
        return text


def job_env_vars() -> dict[str, str]:
    """The env vars of the runtime env this driver was submitted with (``ray job submit``),
    else empty. ``ray.init`` refuses a runtime env that sets one of the job's keys again."""
    import json
    import os

    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return {}
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {}
    return dict(runtime_env.get("env_vars") or {})


@contextmanager
def ray_session(address: str | None = None) -> Iterator[None]:
    """Use the connected Ray; else connect to ``address`` (None: ``RAY_ADDRESS`` or a new
    local cluster, as ``ray.init`` does) and disconnect at the end."""
    import ray

    if ray.is_initialized():
        yield
        return
    env = {k: v for k, v in WORKER_ENV.items() if k not in job_env_vars()}
    ray.init(address=address, runtime_env={"env_vars": env} if env else None)
    try:
        yield
    finally:
        ray.shutdown()


def count_rows(path: str) -> int:
    """Rows of a Parquet file or folder, from the footers."""
    fs, inner, _ = storage_paths(path)
    return pads.dataset(inner, filesystem=fs, format="parquet").count_rows()


JOB_INPUT = SEARCHES.append(pa.field("supporting_titles", pa.list_(pa.string())))
"""What the jobs read of an input: ``SEARCHES`` and the gold-aware labeler's page titles."""


def input_columns(path: str, wanted: pa.Schema = JOB_INPUT) -> list[str]:
    """The columns of ``wanted`` the input has (others are not read)."""
    fs, inner, _ = storage_paths(path)
    names = set(pads.dataset(inner, filesystem=fs, format="parquet").schema.names)
    return [name for name in wanted.names if name in names]


@dataclass(frozen=True)
class Job:
    """What one run of the pipeline does: read ``input`` (searches Parquet), write ``output``
    (a folder of part files, resumed if it exists), and in between call
    ``actor(**actor_kwargs)`` (constructed once per pool actor) with ``pyarrow.Table`` batches.

    ``name`` and ``manifest`` are recorded in the output's manifest (a resumed output must
    match them); ``key_column`` is the output column counted per value (mode or status), each
    input row yielding ``rows_per_input`` output rows; ``retry_errors`` scores the searches
    with an error row again, replacing their rows.
    """

    name: str
    input: str
    output: str
    actor: type
    actor_kwargs: dict[str, Any]
    manifest: dict[str, Any]
    key_column: str
    rows_per_input: int = 1
    retry_errors: bool = False


def run_job(job: Job, pool: ActorPool) -> JobCounts:
    """Run ``job``'s pipeline on ``pool`` into its output (resuming it) and count what happened.

    The job holds the output's lock throughout (:class:`~acare_ray.offline.lock.OutputLocked`
    if another job holds it). Needs a connected Ray (see :func:`ray_session`).
    """
    started = time.perf_counter()
    rows_in = count_rows(job.input)
    fs, root, _ = storage_paths(job.output)
    run_id = new_run_id()
    with OutputLock(fs, root, run_id):
        state = prepare_output(
            job.output,
            {"job": job.name, **job.manifest},
            retry_errors=job.retry_errors,
            run_id=run_id,
        )
        if "search_id" not in input_columns(job.input):
            # Every row becomes an error row naming the missing id; nothing can be skipped.
            state = replace(state, written=None)
        if state.written is None or unwritten_rows(job.input, state.written) > 0:
            _write(job, state, pool)
        else:
            log.info("%s: every input row is already in %s; nothing to score", job.name, job.output)
        before = set(state.files_before)
        files = part_files(state.fs, state.root)
        mine = [p for p in files if p not in before]
        per_key = tally(state.fs, mine, job.key_column)
    written = sum(v["rows"] for v in per_key.values())
    counts = JobCounts(
        job=job.name,
        output=job.output,
        run_id=state.run_id,
        rows_in=rows_in,
        already_written=state.rows_before,
        written=written,
        errored=sum(v["errored"] for v in per_key.values()),
        output_rows=state.rows_before + written,
        files_written=len(mine),
        removed_incomplete=len(state.removed_incomplete),
        wall_s=time.perf_counter() - started,
        rows_per_input=job.rows_per_input,
        per_key=per_key,
        retried=state.retried,
    )
    log.info("%s", counts.describe())
    return counts


def _write(job: Job, state: OutputState, pool: ActorPool) -> None:
    """read -> skip written -> blocks of ``BATCHES_PER_BLOCK`` batches -> actor pool -> write,
    streaming into ``state``'s folder (within the pool's object-store budget, if it has one)."""
    with store_budget(pool.store_budget_bytes):
        _stream(job, state, pool)


@contextmanager
def store_budget(nbytes: int | None) -> Iterator[None]:
    """Cap the object-store memory of the datasets executed inside (Ray Data's resource
    limits on this driver's ``DataContext``), then restore the previous limits; None leaves
    Ray Data's own limit.

    Without a cap Ray Data reads ahead of slow actors up to its share of the whole object
    store (half of it by default), so what the job holds grows with the input."""
    from ray.data import DataContext

    if nbytes is None:
        yield
        return
    options = DataContext.get_current().execution_options
    before = options.resource_limits
    options.resource_limits = before.copy(object_store_memory=nbytes)
    try:
        yield
    finally:
        options.resource_limits = before


def footer_readers(n_files: int) -> int:
    """Footer-reading actors for a read of ``n_files`` Parquet files: one per batch of files
    Ray Data hands an actor, at most Ray Data's own default."""
    return min(MAX_FOOTER_READERS, max(1, math.ceil(n_files / FILES_PER_FOOTER_READER)))


@contextmanager
def sized_footer_readers(n_files: int) -> Iterator[None]:
    """Plan the reads inside with :func:`footer_readers` ``(n_files)`` footer actors, unless
    ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` is set (then that is kept).

    Ray Data builds its pool of footer readers for every read, each a new worker process
    (about 2 CPU-seconds to start), whatever the number of files: a job over a few files
    started 32 processes that had nothing to read (docs/offline.md). The pool size is read
    from the environment when ``read_parquet`` plans the read, so it is set only around that
    call."""
    if FOOTER_READERS_ENV in os.environ:
        yield
        return
    # Ray Data also reads the setting once, at import, for its module default: import that
    # module first, so a read planned later outside a job keeps Ray Data's default.
    with suppress(ImportError):
        import ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer  # noqa: F401
    os.environ[FOOTER_READERS_ENV] = str(footer_readers(n_files))
    try:
        yield
    finally:
        del os.environ[FOOTER_READERS_ENV]


def input_files(path: str) -> int:
    """How many Parquet files the input ``path`` (a file or a folder) holds."""
    fs, inner, _ = storage_paths(path)
    if fs.get_file_info(inner).is_file:
        return 1
    return len(part_files(fs, inner))


def _stream(job: Job, state: OutputState, pool: ActorPool) -> None:
    import ray
    from ray.data.datasource import FilenameProvider

    _, _, ray_input = storage_paths(job.input)
    with sized_footer_readers(input_files(job.input)):
        ds = ray.data.read_parquet(ray_input, columns=input_columns(job.input))
    if state.written is not None:
        ds = ds.map_batches(
            skip_written, fn_kwargs={"written": [state.written]}, batch_format="pyarrow"
        )
    # A Parquet row group is read as one block and one block is one actor task; cut blocks
    # to a few batches so every actor of the pool gets work and output is written as it goes.
    ds = ds.repartition(target_num_rows_per_block=pool.batch_size * BATCHES_PER_BLOCK)
    ds = ds.map_batches(
        job.actor,
        fn_constructor_kwargs={**job.actor_kwargs, "cpus": pool.cpus_per_actor},
        compute=ray.data.ActorPoolStrategy(min_size=pool.min_size, max_size=pool.max_size),
        num_gpus=pool.gpus_per_actor or None,
        # 1 CPU is Ray Data's default; passing it beside num_gpus only logs a warning.
        num_cpus=None if pool.cpus_per_actor == 1 else pool.cpus_per_actor,
        batch_size=pool.batch_size,
        batch_format="pyarrow",
    )
    ds.write_parquet(
        state.ray_path,
        filename_provider=FilenameProvider(dataset_uuid=state.run_id, file_format="parquet"),
        min_rows_per_file=pool.rows_per_file,
    )
