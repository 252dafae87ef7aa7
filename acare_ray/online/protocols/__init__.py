"""The wire protocols the app speaks, one module each: their request and response models, and
how a response is made from a :class:`~acare_ray.online.serving.RerankOutcome`.

- :mod:`~acare_ray.online.protocols.common`: the ACARe context fields every protocol takes;
- :mod:`~acare_ray.online.protocols.cohere`: Cohere rerank v1/v2 (``/v1/rerank``, ``/v2/rerank``);
- :mod:`~acare_ray.online.protocols.vllm`: vLLM's score API (``/score``, ``/v1/score``) and its
  rerank fields on ``/v1/rerank``, the shape vLLM's and Jina's rerank clients send there (Jina's
  rerank API is that shape, so it has no module of its own);
- :mod:`~acare_ray.online.protocols.tei`: text-embeddings-inference ``/rerank`` and its error
  body.

Score definition: the model's score is raw log-odds ``s`` (:mod:`acare_ray.scoring.scorer`).
Every protocol's 0..1 value is made by one rule (:mod:`acare_ray.online.serving`): the
checkpoint's calibration for the mode where it has one, else ``sigmoid(s)``; ``s`` itself where
the request asks for raw values (TEI ``raw_scores``, vLLM ``use_activation: false``). Results
are ordered by ``s``, best first, equal scores in input order, or by the fusion with the
request's first stage (:mod:`acare_ray.online.fusion_fields`).

Unknown fields are refused (422), so a misspelt context field never goes unnoticed; fields a
protocol's clients send that this server does not act on are accepted, as each module says.
"""
