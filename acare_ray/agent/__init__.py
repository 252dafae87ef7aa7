"""``acare agent-bench``: a simulated, scripted agent with the reranker in the loop (no Ray).

- :mod:`~acare_ray.agent.tasks`: MuSiQue questions -> tasks, the pooled BM25 corpus;
- :mod:`~acare_ray.agent.rerankers`: the :class:`AgentReranker` protocol and its implementations
  (BM25 order, an in-process :class:`~acare_ray.scoring.scorer.Scorer`, an oracle, a Cohere-compatible
  endpoint);
- :mod:`~acare_ray.agent.simulate`: the deterministic agent and closed-loop concurrent sessions;
- :mod:`~acare_ray.agent.bench`: the config, ``run(config)`` and the JSON / markdown / PNG report;
- :mod:`~acare_ray.agent.cli`: the ``acare agent-bench`` command.

See docs/agent_bench.md.
"""
