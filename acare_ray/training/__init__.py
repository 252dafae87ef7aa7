"""LCE fine-tuning as a Ray Train job (DESIGN section 7): ``run(TrainConfig) -> checkpoint``."""

from acare_ray.training.config import TrainConfig


def run(config: TrainConfig):
    """See :func:`acare_ray.training.trainer.run` (imported lazily: it pulls in Ray)."""
    from acare_ray.training.trainer import run as _run

    return _run(config)


__all__ = ["TrainConfig", "run"]
