"""The bf16-vs-float32 CPU training benchmark: it times both precisions through the product's
training step and records the setting ``cpu_bf16: auto`` resolves to on the machine."""

from __future__ import annotations

import json
import shlex

from benchmarks_import import benchmark_modules

from acare_ray.training.loop import native_cpu_bf16


def test_the_benchmark_times_both_precisions_and_records_the_auto_choice(tmp_path, tiny_qwen3_dir):
    with benchmark_modules("bench_cpu_bf16") as (bench,):
        argv = ["--repeats", "1", "--model", str(tiny_qwen3_dir), "--label", "t"]
        argv += ["--out", str(tmp_path)]
        bench.main(argv)
        report = json.loads((tmp_path / "cpu-bf16-t.json").read_text())
        timing = report["timing"]
        assert report["native_bf16"] == report["auto_uses_bf16"] == native_cpu_bf16()
        assert {len(v) for v in timing["seconds"].values()} == {1}
        assert all(s > 0 for v in timing["seconds"].values() for s in v)
        assert timing["bf16_over_float32"] == (
            timing["median_s"]["bf16"] / timing["median_s"]["float32"]
        )
        # bf16 rounds the scores: the same first step, a close but not equal loss
        first = timing["first_step_loss"]
        assert abs(first["bf16"] - first["float32"]) < 0.1
        # the command the results file gives makes the same run
        command = shlex.split(report["command"])
        assert command[:3] == ["python", "-m", "benchmarks.bench_cpu_bf16"]
        parsed = bench.build_parser().parse_args([*command[3:], "--out", str(tmp_path)])
        assert (parsed.repeats, parsed.model, parsed.label) == (1, str(tiny_qwen3_dir), "t")
        markdown = (tmp_path / "cpu-bf16-t.md").read_text()
        assert report["command"] in markdown
        assert ("trains in **bf16**" if native_cpu_bf16() else "trains in **float32**") in markdown
