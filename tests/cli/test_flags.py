"""acare_ray.cli.flags.config_from_flags: CLI flags -> a config dataclass by field name (used by
``acare demo`` and ``acare agent-bench``)."""

import argparse

from acare_ray.cli import demo
from acare_ray.cli.flags import config_from_flags


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


def test_demo_flags_map_onto_config_fields():
    args = _parse(
        "--output", "o", "--model", "m", "--train-sessions", "7", "--eval-sessions", "5",
        "--steps", "3", "--lr", "0.5", "--baseline",
    )  # fmt: skip
    config = config_from_flags(demo.DemoConfig, args)
    defaults = demo.DemoConfig()
    assert config == demo.DemoConfig(
        output="o", model="m", train_sessions=7, eval_sessions=5, steps=3, lr=0.5, baseline=True
    )
    assert (config.modes, config.seed, config.max_length) == (
        defaults.modes,
        defaults.seed,
        defaults.max_length,
    )


def test_demo_without_flags_is_the_default_config():
    assert config_from_flags(demo.DemoConfig, _parse()) == demo.DemoConfig()


def test_values_override_flags_and_other_flags_are_ignored():
    from acare_ray.agent.bench import AgentBenchConfig

    args = argparse.Namespace(
        out=None, tasks=7, resamples=99, reranker="oracle", command="agent-bench", depth=4
    )
    config = config_from_flags(AgentBenchConfig, args, out="o", n_resamples=args.resamples)
    assert (config.out, config.tasks, config.depth, config.n_resamples) == ("o", 7, 4, 99)
    assert config.reranker == "oracle"
    assert config.budget == AgentBenchConfig(out="o").budget
