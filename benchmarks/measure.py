"""Timing and memory helpers for the benchmarks: wall time, peak memory, model FLOPs."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import torch

H100_H200_BF16_DENSE_FLOPS = 989e12


@dataclass
class Measured:
    seconds: float  # wall clock
    cpu_seconds: float  # this process's CPU time, all threads: robust to other processes' load
    peak_mb: float


class _RssSampler:
    """Peak resident set size of this process while running, sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.start = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.interval)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def measure(fn, device: torch.device):
    """Run ``fn()``; return its result and :class:`Measured` (wall and CPU seconds, peak MB).

    CUDA: peak allocated device memory above what was allocated before. CPU: peak resident set
    size of the process above its size before (sampled, so very short spikes can be missed).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        began, cpu = time.perf_counter(), time.process_time()
        result = fn()
        torch.cuda.synchronize(device)
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
        peak = torch.cuda.max_memory_allocated(device) - before
        return result, Measured(seconds, cpu, peak / 2**20)
    with _RssSampler() as rss:
        began, cpu = time.perf_counter(), time.process_time()
        result = fn()
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    return result, Measured(seconds, cpu, (rss.peak - rss.start) / 2**20)


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the token embedding and the (tied or untied) vocabulary head."""
    skip = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def model_flops(params: int, tokens: int) -> float:
    """The usual 2 x non-embedding params x tokens (attention scores not counted)."""
    return 2.0 * params * tokens
