"""Measuring rankings, free of Ray and HTTP (docs/architecture.md, section 1).

- :mod:`~acare_ray.eval.ir_metrics`: nDCG/recall/MRR, paired significance tests;
- :mod:`~acare_ray.eval.bands`: searches banded by the first stage's own score;
- :mod:`~acare_ray.eval.session_replay`: replaying an agent's searches and scoring its lists;
- :mod:`~acare_ray.eval.splits`: question-level train/validation/test splits.
"""
