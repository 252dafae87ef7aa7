"""Offline jobs on Ray Data: rerank, relabel and evaluate over Parquet (docs/architecture.md 5.1).

Each job is a config dataclass and a ``run(config)``; the Ray Data actors are thin wrappers
around :class:`~acare_ray.scoring.scorer.Scorer` (``actor.py``) and the per-batch work is plain Python
(``score.py``). ``job.py`` holds the shared pipeline, ``resume.py`` the resumable output folder.
"""
