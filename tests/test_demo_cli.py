"""``acare demo`` flags -> DemoConfig: every flag lands on its field, the rest keep defaults."""

import argparse

from acare_ray import demo


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


def test_demo_flags_map_onto_config_fields():
    args = _parse(
        "--output", "o", "--model", "m", "--train-sessions", "7", "--eval-sessions", "5",
        "--steps", "3", "--lr", "0.5", "--baseline",
    )  # fmt: skip
    config = demo._config_of(args)
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
    assert demo._config_of(_parse()) == demo.DemoConfig()
