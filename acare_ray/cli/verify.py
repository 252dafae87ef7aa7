"""``acare verify MODEL``: does a checkpoint still score as it did when it was saved?

A checkpoint written by ``acare train`` carries golden cases (:mod:`acare_ray.scoring.golden`);
``verify`` loads the model as a Serve replica would (device, dtype, revision) and scores them
again. A model without golden cases gets the reference check: the fast path against a plain
Hugging Face forward of the official prompt (causal LMs; a cross-encoder without golden cases
has no reference to check against). Exit 0: verified; 1: it does not score as it should (or
does not load); 2: nothing to check it against.
"""

from __future__ import annotations

import argparse
import sys


def verify_command(args: argparse.Namespace) -> int:
    from acare_ray.scoring import Scorer
    from acare_ray.scoring.golden import read_golden, reference_mismatches, verify

    try:
        scorer = Scorer.from_pretrained(
            args.model,
            device=args.device,
            dtype=args.dtype,
            revision=args.revision,
            backend=args.backend,
        )
        cases = read_golden(args.model)
    except Exception as err:  # a damaged checkpoint fails to load in many ways; say which
        print(f"acare verify: {args.model}: does not load: {type(err).__name__}: {err}",
              file=sys.stderr)  # fmt: skip
        return 1
    if cases:
        try:
            checked = verify(scorer, cases, args.model)
        except RuntimeError as err:
            print(f"acare verify: FAILED: {err}", file=sys.stderr)
            return 1
        print(f"verified: {checked} golden cases score as the checkpoint recorded")
        return 0
    if not scorer.backend.has_reference:
        print(
            f"acare verify: {args.model}: no golden cases and no reference for a "
            f"{scorer.backend.name} backend: nothing to check it against",
            file=sys.stderr,
        )
        return 2
    found = reference_mismatches(scorer, args.model, args.revision)
    if found:
        shown = "; ".join(str(m) for m in found[:3])
        print(
            f"acare verify: FAILED: {len(found)} cases differ from the official recipe on the "
            f"official prompt: {shown}",
            file=sys.stderr,
        )
        return 1
    print("verified: no golden cases; scores equal the official recipe on the official prompt")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check that a model scores as it did when saved (golden cases, or the reference)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("model", help="checkpoint folder or HF id")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--backend", default="auto", choices=("auto", "causal_lm", "cross_encoder"))
    parser.set_defaults(func=verify_command)
