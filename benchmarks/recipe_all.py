"""The published recipe: ``acare adopt`` with the committed config for our data, one seed, its
report copied into ``benchmarks/results/<name>-seed<seed>.{md,json}`` (``--name``, default
``adopt-dense``).

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.recipe_all --seed 0

is ``acare adopt --config adopt_configs/r1-searcher-hotpotqa-dense.yaml --seed 0`` (resumable:
stages already done in ``runs/adopt-dense`` are read, not redone) followed by the copy;
``--config`` runs another (``adopt_configs/r1-searcher-hotpotqa.yaml``: the same full pass with
BM25's hard negatives). The recipe itself (sources, split, mining, training, the safe fusion
fit, test, cost, agent loop) lives in the product (:mod:`acare_ray.adopt`); this script only
files its figures. ``--summarize 0,1,2`` puts the seeds side by side (``acare adopt
--summarize-seeds``); a seed whose run folder is gone (one run in an earlier session) is read
back from its committed ``<name>-seed<seed>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "adopt_configs/r1-searcher-hotpotqa-dense.yaml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="training seed (the split is fixed)")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--stages", default=None, help="passed to acare adopt (default: all)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--name",
        default="adopt-dense",
        help="file prefix: <name>-seed<seed>.{md,json,png} and <name>-seeds.{md,json}",
    )
    parser.add_argument(
        "--summarize",
        default=None,
        metavar="0,1,2",
        help="run nothing: acare adopt --summarize-seeds, copied to <name>-seeds.{md,json}; a seed "
        "whose run folder is gone is read from its committed <name>-seed<seed>.json",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    import dataclasses

    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.adopt.stages import stage_file
    from acare_ray.cli import main as acare

    args = build_parser().parse_args(argv)
    if args.summarize:
        return summarize(args)
    command = ["adopt", "--config", args.config, "--seed", str(args.seed)]
    if args.stages:
        command += ["--stages", args.stages]
    code = acare(command)
    if code:
        return code
    config = dataclasses.replace(AdoptConfig.read(args.config), seed=args.seed)
    seed_dir = config.seed_dir
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.report import REPO, dump_json

    if (seed_dir / "report.md").exists():
        text = (seed_dir / "report.md").read_text().replace(f"{REPO}/", "")
        (out / f"{args.name}-seed{args.seed}.md").write_text(text)
        if (seed_dir / "report.png").exists():
            shutil.copyfile(seed_dir / "report.png", out / f"{args.name}-seed{args.seed}.png")
        stages = {}
        # the stages outside the seed's folder: data, baseline and a dense miner's shared round
        for stage in ("data", "baseline", "mine"):
            path = stage_file(config, stage)
            if path.exists():
                stages[stage] = json.loads(path.read_text())
        for path in sorted(seed_dir.glob("*.json")):
            stages[path.stem] = json.loads(path.read_text())
        record = {"command": "acare " + " ".join(command), **stages}
        dump_json(record, out / f"{args.name}-seed{args.seed}.json")  # repository paths relative
    return 0


def summarize(args: argparse.Namespace) -> int:
    """``acare adopt --summarize-seeds``, its files copied to ``<name>-seeds.{md,json}``."""
    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.cli import main as acare

    work = AdoptConfig.read(args.config).work
    out = Path(args.out)
    restored = [
        seed
        for seed in (int(s) for s in args.summarize.split(","))
        if restore_seed(work / f"seed{seed}", out / f"{args.name}-seed{seed}.json")
    ]
    code = acare(["adopt", "--config", args.config, "--summarize-seeds", args.summarize])
    if code:
        return code
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.report import REPO, dump_json

    text = (work / "seeds.md").read_text().replace(f"{REPO}/", "")
    if restored:
        names = ", ".join(f"`{args.name}-seed{seed}.json`" for seed in restored)
        seeds = ", ".join(map(str, restored))
        if len(restored) > 1:
            text += f"\nSeeds {seeds} read from their committed files ({names}).\n"
        else:
            text += f"\nSeed {seeds} read from its committed file ({names}).\n"
    (out / f"{args.name}-seeds.md").write_text(text)
    dump_json(json.loads((work / "seeds.json").read_text()), out / f"{args.name}-seeds.json")
    return 0


def restore_seed(seed_dir: Path, record: Path) -> bool:
    """Write a seed's stage files back into ``seed_dir`` from its committed record (what
    ``main`` filed in ``<name>-seed<seed>.json``) when its run folder has no test stage, so seeds
    run in different sessions, whose run folders are gone, summarize together. True when it did."""
    if (seed_dir / "test.json").is_file() or not record.is_file():
        return False
    stages = json.loads(record.read_text())
    seed_dir.mkdir(parents=True, exist_ok=True)
    for stage, figures in stages.items():
        if stage not in ("command", "data", "baseline"):  # work-level files, not the seed's
            (seed_dir / f"{stage}.json").write_text(json.dumps(figures, indent=2) + "\n")
    return True


if __name__ == "__main__":
    sys.exit(main())
