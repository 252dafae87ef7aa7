"""From scores to the list an agent gets, free of Ray and HTTP (docs/architecture.md, section 1).

- :mod:`~acare_ray.ranking.fusion`: fusing the reranker's order with the first stage's;
- :mod:`~acare_ray.ranking.fusion_fit`: fitting the fusion setting on validation searches;
- :mod:`~acare_ray.ranking.calibration`: score to 0..1 relevance;
- :mod:`~acare_ray.ranking.checkpoint_settings`: the fusion and calibration a checkpoint carries.
"""
