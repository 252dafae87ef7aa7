"""benchmarks/recipe_all.py and `make recipe`: both run `acare adopt` with the committed config."""

from __future__ import annotations

import shlex

from benchmarks_import import BENCHMARKS, benchmark_modules

from acare_ray.adopt.cli import register
from acare_ray.adopt.config import STAGES, AdoptConfig


def test_make_recipe_runs_acare_adopt_with_the_committed_config():
    """`make recipe` (README, docs/training.md) is an hour-long run; this checks the command it
    runs parses as written and its config reads."""
    import argparse

    makefile = (BENCHMARKS.parent / "Makefile").read_text()
    block = makefile.split("\nrecipe:", 1)[1].split("\n\n", 1)[0]
    line = next(x for x in block.splitlines() if "adopt" in x)
    argv = shlex.split(line.replace("$(SEED)", "0").replace("$(BIN)/", ""))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv[argv.index("acare") + 1 :])
    assert args.command == "adopt" and args.seed == 0
    assert set(args.stages.split(",")) <= set(STAGES)
    config = AdoptConfig.read(BENCHMARKS.parent / args.config)
    assert config.primary.name == "traces"


def test_the_benchmark_script_is_the_same_command():
    with benchmark_modules("recipe_all") as (recipe_all,):
        args = recipe_all.build_parser().parse_args(["--seed", "2"])
        assert (args.seed, args.config) == (2, recipe_all.CONFIG)
        assert (BENCHMARKS.parent / args.config).is_file()
