"""Framework adapters that forward the agent's question and reasoning to the reranker (optional
extras: ``pip install 'acare_ray[langchain]'`` / ``'acare_ray[llamaindex]'``).

- :class:`acare_ray.adapters.langchain.AcareRerank`: a LangChain ``BaseDocumentCompressor``;
- :class:`acare_ray.adapters.llamaindex.AcareRerank`: a LlamaIndex ``BaseNodePostprocessor``.

Both call ``POST /v2/rerank`` through :mod:`acare_ray.client` with ``original_question`` and
``reasoning`` set from the adapter's fields (or per call) and put the 0..1 relevance score where
their framework expects it.
"""
