"""Online serving on Ray Serve (docs/architecture.md, section 5.2).

- :mod:`~acare_ray.online.service`: the work, free of HTTP and Ray (validation, truncation,
  token accounting, batch scoring);
- :mod:`~acare_ray.online.admission`: admission by expected wait (503 + ``Retry-After``), free
  of HTTP and Ray;
- :mod:`~acare_ray.online.api`: pydantic request/response models (Cohere v1/v2, TEI, usage);
- :mod:`~acare_ray.online.http`: the FastAPI app (routes, auth, body limit, error bodies);
- :mod:`~acare_ray.online.deployment`: the Serve deployment, dynamic batching, app builder;
- :mod:`~acare_ray.online.cli`: ``acare serve``.
"""
