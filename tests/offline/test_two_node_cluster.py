"""A simulated two-node cluster where only one node advertises a GPU."""

from __future__ import annotations

import json
import os
import sys

import pytest
import ray
import ray.cloudpickle
from offline_support import read_rows

from acare_ray.offline.actor import ScorerActor
from acare_ray.offline.job import WORKER_ENV, ActorPool, Job, run_job

pytestmark = pytest.mark.slow

# Workers cannot import this test module; ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class WhereAmI(ScorerActor):
    """Records the node it runs on, the GPUs Ray gave it and the device it scores on."""

    def __init__(self, record_dir: str, **kwargs) -> None:
        super().__init__(**kwargs)
        record = {
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": str(self.scorer.backend.device),
        }
        with open(os.path.join(record_dir, f"{os.getpid()}.json"), "w") as f:
            json.dump(record, f)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()  # the shared local cluster of other modules; the next one starts it again
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    gpu_node = cluster.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=cluster.address, runtime_env={"env_vars": WORKER_ENV}, log_to_driver=False)
    cluster.wait_for_nodes()
    yield gpu_node.node_id
    ray.shutdown()
    cluster.shutdown()


def test_gpu_actors_land_only_on_the_gpu_node_and_fall_back_to_cpu(
    cluster, mixed_searches, tiny_qwen3_dir, tmp_path
):
    path, rows, errors = mixed_searches
    records = tmp_path / "records"
    records.mkdir()
    job = Job(
        "rerank",
        str(path),
        str(tmp_path / "out"),
        WhereAmI,
        actor_kwargs={
            "record_dir": str(records),
            "model": str(tiny_qwen3_dir),
            "modes": ("M0",),
            "scorer_options": {"max_length": 1024},
        },
        manifest={"test": "two-node"},
        key_column="mode",
    )
    counts = run_job(job, ActorPool(min_size=2, max_size=2, gpus_per_actor=0.5, batch_size=4))
    seen = [json.loads(p.read_text()) for p in records.iterdir()]
    assert seen  # Ray Data may start fewer actors than the pool allows for one input block
    assert {s["node_id"] for s in seen} == {cluster}
    assert all(s["gpu_ids"] == ["0"] for s in seen)  # two actors share the one GPU (0.5 each)
    assert all(s["device"] == "cpu" for s in seen)  # no CUDA here: CPU fallback, not a crash
    assert sorted(r["search_id"] for r in read_rows(tmp_path / "out")) == sorted(
        r["search_id"] for r in rows
    )
    assert counts.errored == len(errors)
