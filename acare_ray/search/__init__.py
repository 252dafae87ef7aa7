"""Search for agents: a first stage (a built-in BM25 index, or an upstream HTTP search API),
the reranker with the agent's context, and session memory of what the agent has seen.

- :mod:`acare_ray.search.index`: ``acare index`` builds an index folder from a corpus;
- :mod:`acare_ray.search.first_stage`: the first stages behind one protocol;
- :mod:`acare_ray.search.sessions`: bounded per-client session memory;
HTTP-free: the Serve app's ``POST /v1/search`` and ``/v1/sessions`` routes over these are
:mod:`acare_ray.online.search_routes`.
"""
