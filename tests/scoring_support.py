"""What the scoring tests share: a search with the full agent context, documents of very
different lengths, the official recipe the causal scorer is checked against, and the short
candidates the online tests send."""

from __future__ import annotations

from acare_ray.scoring import AgentContext

QUERY = "capital population"
QUESTION = "What is the population of the capital of the country where Anna Berg was born?"
REASONING = "Anna Berg was born in Velmoria, so I need the capital of Velmoria and its population."
CONTEXT = AgentContext(QUERY, question=QUESTION, reasoning=REASONING)
# Four short candidates of that search, for the online tests (each adds its own).
CAPITAL_DOCUMENTS = (
    "Ostrava is the capital of Velmoria and has a population of 1.2 million.",
    "Paris is the capital of France.",
    "Anna Berg is a singer from Velmoria.",
    "The capital of Zandor, Quell, counts 300,000 inhabitants.",
)
DOCUMENTS = [
    "Ostrava is the capital of Velmoria and has a population of 1.2 million.",
    "Paris is the capital of France.",
    "short",
    "The capital of Zandor, Quell, counts 300,000 inhabitants according to the 2011 census, "
    "making it the largest city in the region and a hub for trade along the river delta. " * 3,
    "Population statistics for capitals in Europe vary widely.",
    "Anna Berg is a singer.",
    "Velmoria is a small country.",
]
