"""Next levers on the GPU, measured end to end: which CUDA kernel the split attention calls, and
how much of a search is host time. Not part of ``gpu.sh``; a one-off that ran on one H200.

For each ``--config`` (random weights, the fixed workload: 100 candidates, 1,000-token M3 prefix,
256-token documents, bf16, compiled layers as loaded by default):

- pairs/s per mode with ``fast.cuda_kernel`` = ``flash`` (PyTorch's flash-2) and ``cudnn``
  (cuDNN's fused attention, which also returns the log-sum-exp), and each one's largest score
  gap to the other;
- host vs device time of one M3 search of 100 and of 4 candidates: wall, device time of all
  kernels (torch.profiler), the tokenizing time the scorer counts, the kernel launches.

Writes ``<out>/gpu-levers.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import benchmarks.bench_scorer as bs
from acare_ray.scoring import Mode
from acare_ray.scoring.causal import fast


def timed(scorer, search, mode, device) -> tuple[float, np.ndarray]:
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    scores = scorer.score(search.context, search.documents, mode)
    torch.cuda.synchronize(device)
    return time.perf_counter() - began, scores


def host_split(scorer, search, device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    scorer.score(search.context, search.documents, Mode.M3)
    before = scorer.stats.tokenize_s
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds, _ = timed(scorer, search, Mode.M3, device)
    device_us, launches = 0.0, 0
    for event in prof.key_averages():
        if "LaunchKernel" in event.key:
            launches += event.count
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            device_us += getattr(event, "self_device_time_total", 0.0)
    plain = min(timed(scorer, search, Mode.M3, device)[0] for _ in range(5))
    return {
        "candidates": len(search.documents),
        "wall_ms_profiled": 1e3 * seconds,
        "wall_ms": 1e3 * plain,
        "device_ms": device_us / 1e3,
        "tokenize_ms": 1e3 * (scorer.stats.tokenize_s - before),
        "kernel_launches": launches,
    }


def run(cfg: bs.BenchConfig) -> dict:
    device = torch.device(cfg.device)
    with tempfile.TemporaryDirectory(prefix="acare-levers-") as folder:
        scorer, _ = bs.load(cfg, device, Path(folder))
    searches = bs.workload(cfg, scorer)
    small = bs.fixed_workload(scorer.backend.encoder, 1, 4, cfg.prefix_tokens, cfg.doc_tokens, 5)
    out = {"config": cfg.config, "kernels": {}}
    scores = {}
    for kernel in fast.CUDA_KERNELS:
        fast.cuda_kernel = kernel
        row = {}
        try:
            for mode in (Mode.M0, Mode.M3):
                timed(scorer, searches[0], mode, device)  # warm-up, recompiles for the kernel
                seconds, got = 0.0, []
                for s in searches:
                    t, g = timed(scorer, s, mode, device)
                    seconds, got = seconds + t, got + [g]
                row[mode.value] = {"pairs_per_s": sum(len(s.documents) for s in searches) / seconds}
                scores[(kernel, mode)] = np.concatenate(got)
            row["host_m3_100"] = host_split(scorer, searches[-1], device)
            row["host_m3_4"] = host_split(scorer, small[0], device)
        except Exception as error:  # noqa: BLE001 - record it, try the next kernel
            row["error"] = f"{type(error).__name__}: {error}"[:1500]
        out["kernels"][kernel] = row
        print(kernel, json.dumps(row), flush=True)
    fast.cuda_kernel = "flash"
    for mode in (Mode.M0, Mode.M3):
        if ("cudnn", mode) in scores and ("flash", mode) in scores:
            gap = np.abs(scores[("cudnn", mode)] - scores[("flash", mode)]).max()
            out["kernels"]["cudnn"][mode.value]["max_abs_diff_vs_flash"] = float(gap)
            out["kernels"]["cudnn"][mode.value]["score_spread"] = float(
                np.ptp(scores[("flash", mode)])
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", nargs="+", default=["Qwen3-Reranker-0.6B"])
    p.add_argument("--out", default=str(bs.RESULTS))
    args = p.parse_args(argv)
    reports = []
    for config in args.config:
        cfg = bs.BenchConfig(
            config=config,
            layers=None,
            device="cuda",
            dtype="bfloat16",
            workload="fixed",
            rounds=3,
            candidates=100,
            prefix_tokens=1000,
            doc_tokens=256,
            max_batch_tokens=32768,
            threads=0,
        )
        reports.append(run(cfg))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu-levers.json").write_text(json.dumps(reports, indent=1))
    print(
        "| model | kernel | M0 pairs/s | M3 pairs/s | M3 100 cand: wall / device / tokenize ms | 4 cand: wall / device / tokenize ms |"
    )
    print("|---|---|---:|---:|---|---|")
    for r in reports:
        for kernel, row in r["kernels"].items():
            if "error" in row:
                print(f"| {r['config']} | {kernel} | {row['error'][:200]} | | | |")
                continue
            h, s = row["host_m3_100"], row["host_m3_4"]
            print(
                f"| {r['config']} | {kernel} | {row['M0']['pairs_per_s']:.0f} | "
                f"{row['M3']['pairs_per_s']:.0f} | {h['wall_ms']:.1f} / {h['device_ms']:.1f} / "
                f"{h['tokenize_ms']:.1f} | {s['wall_ms']:.1f} / {s['device_ms']:.1f} / {s['tokenize_ms']:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
