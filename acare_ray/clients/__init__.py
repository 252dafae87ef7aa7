"""What an agent imports to use a running acare_ray server, without torch or Ray.

- :mod:`~acare_ray.clients.http_client`: the HTTP client (rerank and search with context);
- :mod:`~acare_ray.clients.mcp_server`: the MCP server (stdio / streamable HTTP) that forwards an
  agent's tool calls to the server;
- :mod:`~acare_ray.clients.langchain`: :class:`AcareDocumentCompressor`, a LangChain
  ``BaseDocumentCompressor`` (``pip install 'acare_ray[langchain]'``);
- :mod:`~acare_ray.clients.llamaindex`: :class:`AcareNodePostprocessor`, a LlamaIndex
  ``BaseNodePostprocessor`` (``pip install 'acare_ray[llamaindex]'``).

The adapters call ``POST /v2/rerank`` through the HTTP client with ``original_question`` and
``reasoning`` set from their fields (or per call) and put the 0..1 relevance score where their
framework expects it.
"""
