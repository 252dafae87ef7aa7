"""Scorer benchmark: acare_ray's shared-prefix Scorer against the official Hugging Face recipe.

One process, one random-weight Qwen3 of real width (shapes from
``acare_ray/testing/fixtures/model_configs``) and the real Qwen3 tokenizer; searches of 100 candidates; modes
M0 (sub-query only) and M3 (question plus ~512 tokens of reasoning). Methods, on the same model
object and the same inputs:

- ``official``: the Qwen3-Reranker README recipe (each pair tokenized whole, left padding, fixed
  batch size, full-vocabulary logits at every position, then ``logits[:, -1]``);
- ``strong``: the same with ``logits_to_keep=1`` (vocabulary head on the last position only);
- ``ours``: ``Scorer.score_many`` (prefix once per search, token-budget batches, two-row head).

Rounds are interleaved (round r runs every method on search r) so that load from other
processes hits all methods alike. Writes ``<out>/<label>.json`` and ``<out>/<label>.md``.
``make bench`` runs the defaults (CPU, a few minutes on 2 cores); see ``--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from acare_ray.scoring import Mode, Scorer
from acare_ray.scoring.prompt import SYSTEM_PREFIX
from acare_ray.scoring.reference import OfficialRecipe
from acare_ray.testing import (
    TINY_QWEN3,
    build_random_qwen3,
    model_config_path,
    qwen3_tokenizer_dir,
)
from benchmarks.measure import H100_H200_BF16_DENSE_FLOPS, Measured, measure, non_embedding_params
from benchmarks.report import environment, score_gap, summarise, targets, write
from benchmarks.workloads import REASONING_SOURCE, Search, fixed_workload, musique_workload

RESULTS = Path(__file__).resolve().parent / "results"
# Score agreement with the recipe: absolute in float32; in bfloat16 (8 mantissa bits, another
# summation order) relative to the spread of the scores.
SCORE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.05}


@dataclass(frozen=True)
class BenchConfig:
    config: str = "Qwen3-Reranker-0.6B"
    layers: int | None = 4
    device: str = "cpu"
    dtype: str = "float32"
    workload: str = "musique"
    modes: tuple[str, ...] = ("M0", "M3")
    rounds: int = 3
    candidates: int = 100
    baseline_stride: int = 5
    official_pairs: int = 8
    batch_size: int = 8
    prefix_tokens: int = 1000
    doc_tokens: int = 256
    max_batch_tokens: int = 16384
    peak_flops: float | None = None
    threads: int = 1
    seed: int = 0
    name: str | None = None
    out: str = str(RESULTS)

    shrink: bool = False
    compile: bool = False

    @property
    def label(self) -> str:
        layers = "" if self.layers is None else f"-L{self.layers}"
        shape = f"{self.config}{'-shrunk' if self.shrink else ''}{layers}"
        compiled = "-compiled" if self.compile else ""
        return f"{self.name or self.device}-{shape}-{self.dtype}{compiled}-{self.workload}"


def build_model(cfg: BenchConfig, folder: Path) -> Path:
    """A random-weight model of ``cfg.config``'s shapes (``tiny``: the test model's) on disk."""
    from transformers import AutoTokenizer

    overrides = dict(TINY_QWEN3) if cfg.shrink else {}
    if cfg.layers is not None:
        overrides["num_hidden_layers"] = cfg.layers
    base = None
    if cfg.config != "tiny":
        base = cfg.config
        # Qwen3-Embedding-4B's config stops at id 151664; the reranker prompt uses <think> ids.
        vocab = len(AutoTokenizer.from_pretrained(qwen3_tokenizer_dir()))
        overrides["vocab_size"] = max(vocab, base_config_vocab(cfg.config))
    dtype = getattr(torch, cfg.dtype)
    # Initialising 4B random weights is minutes on CPU and seconds on the GPU.
    with torch.device(cfg.device):
        return build_random_qwen3(folder, base_config=base, dtype=dtype, **overrides)


def base_config_vocab(name: str) -> int:
    return json.loads(model_config_path(name).read_text())["vocab_size"]


def pair_bodies(scorer: Scorer, search: Search, mode: Mode, indices: list[int]) -> list[str]:
    """Official ``<Instruct>...<Document>: doc`` bodies, with the same capped fields as ours."""
    head = scorer.backend.encoder.prefix_text(search.context, mode)[len(SYSTEM_PREFIX) :]
    return [f"{head} {search.documents[i]}" for i in indices]


def timed_run(scores: np.ndarray, measured: Measured) -> dict:
    """The part of a method's run record every method has: its scores and what it cost."""
    return {
        "scores": scores,
        "pairs": len(scores),
        "seconds": measured.seconds,
        "cpu_seconds": measured.cpu_seconds,
        "peak_mb": measured.peak_mb,
    }


def run_ours(scorer: Scorer, search: Search, mode: Mode, device: torch.device) -> dict:
    stats = scorer.stats
    before = (stats.real_tokens, stats.computed_tokens, stats.tokenize_s)
    scores, measured = measure(lambda: scorer.score(search.context, search.documents, mode), device)
    return {
        **timed_run(scores, measured),
        "tokenize_s": stats.tokenize_s - before[2],
        "real_tokens": stats.real_tokens - before[0],
        "computed_tokens": stats.computed_tokens - before[1],
    }


def run_recipe(recipe: OfficialRecipe, pairs: list[str], device: torch.device) -> dict:
    recipe.stats = type(recipe.stats)()
    scores, measured = measure(lambda: recipe.score(pairs), device)
    return {
        **timed_run(scores, measured),
        "tokenize_s": recipe.stats.tokenize_s,
        "real_tokens": recipe.stats.real_tokens,
        "computed_tokens": recipe.stats.computed_tokens,
    }


def tokenize_only(
    scorer: Scorer, recipe: OfficialRecipe, searches: list[Search], mode: Mode, repeats: int = 3
) -> dict:
    """Seconds per search to turn all candidates into ids, the official per-pair calls vs ours
    (fastest of ``repeats``, so a burst of load elsewhere does not decide it)."""
    encoder = scorer.backend.encoder
    bodies = [pair_bodies(scorer, s, mode, range(len(s.documents))) for s in searches]

    def official() -> None:
        for pairs in bodies:
            for start in range(0, len(pairs), recipe.batch_size):
                recipe.process_inputs(pairs[start : start + recipe.batch_size])

    def ours() -> None:
        for s in searches:
            budget = encoder.document_budget(len(encoder.prefix_ids(s.context, mode)))
            encoder.document_ids(s.documents, [budget] * len(s.documents))

    out = {}
    for name, fn in (("official", official), ("ours", ours)):
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - began)
        out[f"{name}_s_per_search"] = best / len(searches)
    return out


def load(cfg: BenchConfig, device: torch.device, folder: Path | None = None):
    """The scorer (``compile``: as ``cfg.compile`` says, else the scorer's default, which is on
    for CUDA) and the left-padding tokenizer of the recipes. ``folder``: build the model there
    and keep it (other scorers of the same run load it too); else in a temporary folder."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="acare-bench-") as temporary:
        path = build_model(cfg, Path(folder or temporary) / "model")
        scorer = Scorer.from_pretrained(
            str(path),
            device=device,
            dtype=cfg.dtype,
            max_batch_tokens=cfg.max_batch_tokens,
            compile=cfg.compile or None,
        )
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    return scorer, tokenizer


def workload(cfg: BenchConfig, scorer: Scorer) -> list[Search]:
    if cfg.workload == "musique":
        return musique_workload(cfg.rounds, cfg.candidates, seed=cfg.seed)
    encoder = scorer.backend.encoder
    return fixed_workload(
        encoder, cfg.rounds, cfg.candidates, cfg.prefix_tokens, cfg.doc_tokens, cfg.seed
    )


def warm_up(scorer, recipes, searches, modes, device, full: bool) -> None:
    """First calls pay for allocator growth, kernel selection and (``full``) compilation of
    every graph a search needs; keep that out of the timings."""
    first = searches[0]
    for mode in modes:
        scorer.score(first.context, first.documents[: len(first.documents) if full else 8], mode)
        if full:
            scorer.score(first.context, first.documents[:1], mode)
        for recipe in recipes:
            run_recipe(recipe, pair_bodies(scorer, searches[0], mode, [0, 1]), device)


def run(cfg: BenchConfig, loaded: tuple | None = None) -> dict:
    """The benchmark's report; ``loaded``: ``(scorer, tokenizer, setup_s)`` already loaded."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    began = time.perf_counter()
    scorer, tokenizer, setup_s = loaded or (*load(cfg, device), None)
    setup_s = setup_s if setup_s is not None else time.perf_counter() - began
    model = scorer.backend.module.lm
    params = non_embedding_params(model)
    searches = workload(cfg, scorer)
    strong = OfficialRecipe(model, tokenizer, cfg.batch_size, last_logits_only=True)
    official = OfficialRecipe(model, tokenizer, cfg.batch_size, last_logits_only=False)
    modes = [Mode(m) for m in cfg.modes]
    config = {k: v for k, v in asdict(cfg).items() if k != "out"}
    report = {"label": cfg.label, "config": config, "environment": environment()}
    report |= {"setup_s": setup_s, "non_embedding_params": params}
    report["workload"] = workload_info(cfg, scorer, searches)
    recipes = [strong, official] if cfg.official_pairs else [strong]
    began = time.perf_counter()
    compiled = getattr(scorer.backend.module, "compiled", False)
    report["compiled"] = compiled
    warm_up(scorer, recipes, searches, modes, device, full=compiled)
    report["warm_up_s"] = time.perf_counter() - began
    runs = {m: {"ours": [], "strong": [], "official": []} for m in modes}
    for r, search in enumerate(searches):
        sample = list(range(0, len(search.documents), cfg.baseline_stride))
        for mode in modes:
            ours = run_ours(scorer, search, mode, device)
            runs[mode]["ours"].append(ours)
            strong_run = run_recipe(strong, pair_bodies(scorer, search, mode, sample), device)
            strong_run["max_abs_diff_vs_ours"] = score_gap(
                strong_run["scores"], ours["scores"][sample]
            )
            runs[mode]["strong"].append(strong_run)
            if r == 0 and cfg.official_pairs:
                first = sample[: cfg.official_pairs]
                off = run_recipe(official, pair_bodies(scorer, search, mode, first), device)
                off["max_abs_diff_vs_ours"] = score_gap(off["scores"], ours["scores"][first])
                runs[mode]["official"].append(off)
            rates = {
                k: v[-1]["pairs"] / v[-1]["seconds"] for k, v in runs[mode].items() if len(v) > r
            }
            print(
                f"round {r} {mode.value}: "
                + ", ".join(f"{k} {v:.3g} pairs/s" for k, v in rates.items()),
                flush=True,
            )
    report["modes"] = {}
    spread = 0.0
    for mode in modes:
        results = {k: summarise(v, params, cfg.peak_flops) for k, v in runs[mode].items() if v}
        results["tokenize_only"] = tokenize_only(scorer, strong, searches, mode)
        results["score_spread"] = float(
            np.ptp(np.concatenate([r["scores"] for r in runs[mode]["ours"]]))
        )
        spread = max(spread, results["score_spread"])
        report["modes"][mode.value] = results
    basis = "wall" if device.type == "cuda" else "cpu"
    tolerance = SCORE_TOLERANCE[cfg.dtype]
    atol = tolerance if cfg.dtype == "float32" else tolerance * max(1.0, spread)
    report["targets"] = targets(report["modes"], atol, basis)
    report["load_average_end"] = os.getloadavg()
    return report


def workload_info(cfg: BenchConfig, scorer: Scorer, searches: list[Search]) -> dict:
    encoder = scorer.backend.encoder
    docs = [
        len(ids)
        for s in searches
        for ids in encoder.document_ids(s.documents, [10**6] * len(s.documents))
    ]
    info = {
        "kind": cfg.workload,
        "searches": len(searches),
        "candidates_per_search": cfg.candidates,
        "doc_tokens": {"mean": float(np.mean(docs)), "min": min(docs), "max": max(docs)},
        "suffix_tokens": len(encoder.suffix_ids),
        "prefix_tokens": {
            m: float(np.mean([len(encoder.prefix_ids(s.context, Mode(m))) for s in searches]))
            for m in cfg.modes
        },
    }
    if cfg.workload == "musique":
        info["reasoning"] = REASONING_SOURCE
    return info


def parse_args(argv: list[str] | None = None) -> list[BenchConfig]:
    d = BenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config",
        nargs="+",
        default=[d.config],
        help="folders under acare_ray/testing/fixtures/model_configs, or tiny; several run one after another",
    )
    p.add_argument("--shrink", action="store_true", help="the configs with the test model's width")
    p.add_argument("--compile", action="store_true", help="ours with Scorer(compile=True)")
    p.add_argument("--layers", type=int, default=d.layers, help="0: all of the config's layers")
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16"])
    p.add_argument("--workload", default=d.workload, choices=["musique", "fixed"])
    p.add_argument("--modes", nargs="+", default=list(d.modes), choices=[m.value for m in Mode])
    p.add_argument("--rounds", type=int, default=d.rounds, help="searches, one per round")
    p.add_argument("--candidates", type=int, default=d.candidates)
    p.add_argument("--baseline-stride", type=int, default=d.baseline_stride)
    p.add_argument("--official-pairs", type=int, default=d.official_pairs, help="0: skip it")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="the baselines' batch")
    p.add_argument("--prefix-tokens", type=int, default=d.prefix_tokens, help="fixed workload")
    p.add_argument("--doc-tokens", type=int, default=d.doc_tokens, help="fixed workload")
    p.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens)
    p.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help=f"for MFU; H100/H200 bf16: {H100_H200_BF16_DENSE_FLOPS:g}",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=d.threads,
        help="torch threads (0: torch's default). One thread keeps CPU seconds a clean measure "
        "of work on a shared machine",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--name", default=None, help="output file prefix (default: the device)")
    p.add_argument("--out", default=d.out)
    args = vars(p.parse_args(argv))
    args["modes"] = tuple(args["modes"])
    args["layers"] = args["layers"] or None
    return [BenchConfig(**(args | {"config": config})) for config in args.pop("config")]


def main(argv: list[str] | None = None) -> int:
    for cfg in parse_args(argv):
        began = time.perf_counter()
        report = run(cfg)
        json_path, md_path = write(report, Path(cfg.out))
        print(md_path.read_text())
        print(f"wrote {json_path} and {md_path} ({time.perf_counter() - began:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
