"""LCE fine-tuning as a Ray Train job: ``run(TrainConfig) -> checkpoint``.

See docs/architecture.md, section 5.3.
"""

from acare_ray.training.config import TrainConfig


def run(config: TrainConfig):
    """See :func:`acare_ray.training.trainer.run` (imported lazily: it pulls in Ray)."""
    from acare_ray.training.trainer import run as _run

    return _run(config)


__all__ = ["TrainConfig", "run"]
