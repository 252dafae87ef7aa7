"""Online serving on Ray Serve (docs/architecture.md, section 5.2).

- :mod:`~acare_ray.online.service`: the work, free of HTTP and Ray (validation, truncation,
  token accounting, batch scoring);
- :mod:`~acare_ray.online.admission`: admission by expected wait (503 + ``Retry-After``), free
  of HTTP and Ray;
- :mod:`~acare_ray.online.protocols`: the wire protocols' request/response models, one module
  each (Cohere, vLLM, TEI);
- :mod:`~acare_ray.online.serving`: the serving object every route calls (model -> prepare ->
  score -> fuse -> relevance) and its one result type;
- :mod:`~acare_ray.online.routes`: the thin rerank routes;
- :mod:`~acare_ray.online.http`: the FastAPI app (the gate: auth, body limit; error bodies);
- :mod:`~acare_ray.online.deployment`: the Serve deployment, dynamic batching, app builder;
- :mod:`~acare_ray.online.cli`: ``acare serve``.
"""
