"""The causal-LM backend, split by job.

- :mod:`~acare_ray.scoring.causal.backend`: the backend (tokenizing, batching, packing, the
  training and token-accounting hooks);
- :mod:`~acare_ray.scoring.causal.load`: loading the model and the load-time checks that pick
  the fast path or the fallback;
- :mod:`~acare_ray.scoring.causal.fast`: the fast shared-prefix forward;
- :mod:`~acare_ray.scoring.causal.hf_forward`: the model's own forward, the exact fallback the
  fast path is checked against;
- :mod:`~acare_ray.scoring.causal.head`: the two-row yes/no head and the scoring module's
  interface, shared by both paths.
"""
