"""``acare adopt``: config file + flags -> :func:`acare_ray.adopt.stages.run_stages`."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from acare_ray.adopt.config import STAGES


def adopt_command(args: argparse.Namespace) -> int:
    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.adopt.stages import run_stages

    try:
        config = AdoptConfig.read(args.config)
        overrides = {
            k: v for k, v in (("seed", args.seed), ("work_dir", args.work_dir)) if v is not None
        }
        config = dataclasses.replace(config, **overrides)
        if args.summarize_seeds:
            return _summarize(config, args.summarize_seeds)
        stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
        unknown = sorted(set(stages) - set(STAGES))
        if unknown:
            raise ValueError(f"--stages: unknown {unknown}; known: {', '.join(STAGES)}")
        results = run_stages(config, stages)
    except (ValueError, FileNotFoundError) as err:
        print(f"acare adopt: error: {err}", file=sys.stderr)
        return 2
    report = results.get("report")
    if report:
        print(f"decision: {report['overall']['decision']}: {report['overall']['reason']}")
        for agent, d in report["per_agent"].items():
            print(f"  agent {agent}: {d['decision']}")
        print(f"report: {report['files']['markdown']}")
    else:
        print(f"stages done: {', '.join(k for k in results)} (in {config.work})")
    return 0


def _summarize(config, seeds_text: str) -> int:
    from acare_ray.adopt.seeds import write_summary

    try:
        seeds = [int(s) for s in seeds_text.split(",") if s.strip()]
    except ValueError:
        message = f"--summarize-seeds: integers separated by commas, got {seeds_text!r}"
        raise ValueError(message) from None
    summary = write_summary(config.work, seeds)
    verdict = summary["verdict"]
    word = {True: "holds", False: "does not hold", None: "undecided"}[verdict["holds"]]
    print(f"across seeds {seeds}: the claim {word} ({verdict['reason']})")
    print(f"summary: {summary['files']['markdown']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "adopt",
        help="your traces -> split, baseline, training, safe fusion fit, test, cost, decision",
        description=(
            "Take a team's own agent traces to a go/no-go decision: one question split, the "
            "untrained baseline, training to convergence, a fusion fit that stores the "
            "first-stage order unless fusion is a sure gain, every system on the test "
            "questions, cost per search, and a report. Resumable stage by stage."
        ),
    )
    parser.add_argument("--config", required=True, help="the adopt YAML file")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma-separated, from {', '.join(STAGES)} (each runs what it needs first)",
    )
    parser.add_argument("--seed", type=int, default=None, help="training seed (overrides config)")
    parser.add_argument("--work-dir", default=None, help="overrides the config's work_dir")
    parser.add_argument(
        "--summarize-seeds",
        default=None,
        metavar="0,1,2",
        help="run nothing: put these seeds' finished stages side by side (mean, spread, worst "
        "seed, the verdict) in <work_dir>/seeds.md and seeds.json",
    )
    parser.set_defaults(func=adopt_command)
