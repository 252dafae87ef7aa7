"""Online serving benchmark: closed-loop load on the Ray Serve app vs the in-process Scorer.

Agent requests as the issue describes them: mode M3, 100 candidates each (MuSiQue sub-query,
original question and BM25 top-100 paragraphs; **synthetic** reasoning of about 300 tokens, see
``workloads.py``). The same requests are scored

- in process: ``Scorer.score`` one search after another (torch threads = the replica's CPUs),
  before and after the served levels, so drift in machine load shows;
- served: ``POST /v2/rerank`` (Cohere shape + ``original_question``/``reasoning``) by ``c``
  client threads, each sending its next request when the last one answered (closed loop), for
  ``c`` in 1, 4, 16, each level bounded by ``--duration-s``.

Reported per level: requests/s, candidates/s, p50/p99 latency, mean requests per server batch
(``x-acare-batch-requests``), 503s; and the largest gap between served and in-process log-odds.
Writes ``<out>/<label>.json`` and ``<out>/<label>.md``.

``python -m benchmarks.bench_online`` runs the tiny random Qwen3 on CPU (a few minutes); on a
GPU machine pass e.g. ``--model Qwen3-Reranker-0.6B --layers 0 --device cuda --dtype bfloat16``
(random weights at real shapes) or ``--model PATH`` (a checkpoint).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from acare_ray.scoring import Mode, Scorer
from acare_ray.testing import build_random_qwen3, free_port
from benchmarks.cluster_bench import start_ray
from benchmarks.report import write_report
from benchmarks.workloads import REASONING_SOURCE, Search, musique_workload

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class BenchConfig:
    model: str = "tiny"
    layers: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    searches: int = 16
    candidates: int = 100
    reasoning_words: int = 125
    concurrency: tuple[int, ...] = (1, 4, 16)
    duration_s: float = 20.0
    inprocess_s: float = 20.0
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    max_ongoing_requests: int = 16
    max_queued_requests: int = 64
    max_batch_size: int = 8
    batch_wait_timeout_s: float = 0.005
    max_batch_tokens: int = 65536
    seed: int = 0
    name: str | None = None
    out: str = str(RESULTS)

    @property
    def label(self) -> str:
        layers = "" if self.layers is None else f"-L{self.layers}"
        return self.name or f"online-{self.device}-{Path(self.model).name}{layers}-{self.dtype}"


def model_dir(cfg: BenchConfig, folder: Path) -> Path:
    if Path(cfg.model).is_dir():
        return Path(cfg.model)
    overrides = {} if not cfg.layers else {"num_hidden_layers": cfg.layers}
    base = None if cfg.model == "tiny" else cfg.model
    return build_random_qwen3(
        folder, base_config=base, dtype=getattr(torch, cfg.dtype), **overrides
    )


def body(search: Search) -> dict:
    return {
        "model": "acare",
        "query": search.context.sub_query,
        "documents": search.documents,
        "original_question": search.context.question,
        "reasoning": search.context.reasoning,
        "mode": "M3",
    }


def percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    values = np.asarray(seconds) * 1e3
    return {
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
        "mean_ms": float(values.mean()),
    }


def run_inprocess(scorer: Scorer, searches: list[Search], seconds: float) -> dict:
    scorer.score(searches[0].context, searches[0].documents, Mode.M3)
    latencies, began, i = [], time.perf_counter(), 0
    while time.perf_counter() - began < seconds or i == 0:
        search = searches[i % len(searches)]
        started = time.perf_counter()
        scorer.score(search.context, search.documents, Mode.M3)
        latencies.append(time.perf_counter() - started)
        i += 1
    elapsed = time.perf_counter() - began
    return {
        "requests": i,
        "seconds": elapsed,
        "requests_per_s": i / elapsed,
        "candidates_per_s": sum(len(searches[j % len(searches)].documents) for j in range(i))
        / elapsed,
        **percentiles(latencies),
    }


def run_level(url: str, searches: list[Search], concurrency: int, seconds: float) -> dict:
    """Closed loop: ``concurrency`` clients, each sends its next request when the last returns."""
    import httpx

    records: list[tuple[float, int, int, int]] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(worker: int) -> None:
        with httpx.Client(timeout=600) as http:
            k = worker
            while time.perf_counter() < stop_at:
                search = searches[k % len(searches)]
                started = time.perf_counter()
                response = http.post(url, json=body(search))
                took = time.perf_counter() - started
                batch = int(response.headers.get("x-acare-batch-requests", 0))
                with lock:
                    records.append((took, response.status_code, batch, len(search.documents)))
                k += concurrency

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client, range(concurrency)))
    elapsed = time.perf_counter() - began
    ok = [r for r in records if r[1] == 200]
    return {
        "concurrency": concurrency,
        "seconds": elapsed,
        "requests": len(records),
        "ok": len(ok),
        "status_503": sum(r[1] == 503 for r in records),
        "other_errors": sum(r[1] not in (200, 503) for r in records),
        "requests_per_s": len(ok) / elapsed,
        "candidates_per_s": sum(r[3] for r in ok) / elapsed,
        "mean_batch_requests": float(np.mean([r[2] for r in ok])) if ok else None,
        **percentiles([r[0] for r in ok]),
    }


def served_vs_inprocess(base: str, scorer: Scorer, searches: list[Search]) -> float:
    import httpx

    worst = 0.0
    for search in searches[:4]:
        request = body(search) | {"texts": search.documents, "raw_scores": True}
        del request["documents"], request["model"]
        got = httpx.post(f"{base}/rerank", json=request, timeout=600).json()
        served = np.array([r["score"] for r in sorted(got, key=lambda r: r["index"])])
        want = scorer.score(search.context, search.documents, Mode.M3)
        worst = max(worst, float(np.abs(served - want).max()))
    return worst


def serve_app(cfg: BenchConfig, path: Path) -> str:
    from ray import serve

    from acare_ray.online.app_args import AppArgs
    from acare_ray.online.deployment import Reranker

    cpus = max(2, int(np.ceil(cfg.replica_cpus)) + 1)
    start_ray(cpus, int(np.ceil(cfg.replica_gpus)))
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = AppArgs(
        model=str(path),
        device=cfg.device,
        dtype=cfg.dtype,
        api_key_env=None,
        allow_unauthenticated=True,
    )
    app = Reranker.options(
        ray_actor_options={"num_cpus": cfg.replica_cpus, "num_gpus": cfg.replica_gpus},
        max_ongoing_requests=cfg.max_ongoing_requests,
        max_queued_requests=cfg.max_queued_requests,
        user_config={
            "max_batch_size": cfg.max_batch_size,
            "batch_wait_timeout_s": cfg.batch_wait_timeout_s,
            "max_batch_tokens": cfg.max_batch_tokens,
        },
    ).bind(args.model_dump())
    serve.run(app, name="bench", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def workload_info(scorer: Scorer, searches: list[Search]) -> dict:
    encoder = scorer.backend.encoder
    tokenizer = encoder.tokenizer

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    docs = [tokens(" " + d) for s in searches for d in s.documents]
    return {
        "searches": len(searches),
        "candidates_per_search": float(np.mean([len(s.documents) for s in searches])),
        "reasoning_tokens_mean": float(np.mean([tokens(s.context.reasoning) for s in searches])),
        "question_tokens_mean": float(np.mean([tokens(s.context.question) for s in searches])),
        "prefix_tokens_M3_mean": float(
            np.mean([len(encoder.prefix_ids(s.context, Mode.M3)) for s in searches])
        ),
        "doc_tokens_mean": float(np.mean(docs)),
        "reasoning": REASONING_SOURCE,
    }


def run(cfg: BenchConfig) -> dict:
    threads = max(1, int(cfg.replica_cpus))
    torch.set_num_threads(threads)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Same tokenizer threading as the replicas (Serve runs them with parallelism off).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory(prefix="acare-bench-online-") as folder:
        path = model_dir(cfg, Path(folder) / "model")
        scorer = Scorer.from_pretrained(str(path), device=cfg.device, dtype=cfg.dtype)
        searches = musique_workload(
            cfg.searches, cfg.candidates, seed=cfg.seed, reasoning_words=cfg.reasoning_words
        )
        report: dict = {
            "config": asdict(cfg) | {"concurrency": list(cfg.concurrency)},
            "environment": environment(threads),
            "workload": workload_info(scorer, searches),
        }
        report["in_process"] = [run_inprocess(scorer, searches, cfg.inprocess_s)]
        print(f"in-process: {report['in_process'][0]['requests_per_s']:.2f} req/s", flush=True)
        import ray
        from ray import serve

        try:
            base = serve_app(cfg, path)
            report["served_max_abs_diff"] = served_vs_inprocess(base, scorer, searches)
            report["served"] = []
            for concurrency in cfg.concurrency:
                level = run_level(f"{base}/v2/rerank", searches, concurrency, cfg.duration_s)
                report["served"].append(level)
                print(
                    f"c={concurrency}: {level['requests_per_s']:.2f} req/s, "
                    f"p50 {level['p50_ms']:.0f} ms, p99 {level['p99_ms']:.0f} ms, "
                    f"batch {level['mean_batch_requests']:.2f}",
                    flush=True,
                )
        finally:
            serve.shutdown()
            ray.shutdown()
        report["in_process"].append(run_inprocess(scorer, searches, cfg.inprocess_s))
        print(f"in-process: {report['in_process'][1]['requests_per_s']:.2f} req/s", flush=True)
    report["environment"]["load_average_at_end"] = os.getloadavg()[0]
    return report


def environment(threads: int) -> dict:
    import ray
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ray": ray.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "load_average_at_start": os.getloadavg()[0],
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def markdown(report: dict, label: str) -> str:
    cfg, work, env = report["config"], report["workload"], report["environment"]
    hardware = env.get("gpu") or f"{env['cpu_count']} CPU cores"
    lines = [
        f"# Online serving benchmark: {label}",
        "",
        f"Model: `{cfg['model']}` (random weights unless a checkpoint path), layers="
        f"{cfg['layers'] or 'all'}, {cfg['dtype']} on {cfg['device']}"
        f" ({hardware}, load average {env['load_average_at_start']:.2f} at start, "
        f"{env['load_average_at_end']:.2f} at end). Replica: {cfg['replica_cpus']} CPU, "
        f"{cfg['replica_gpus']} GPU; max_ongoing_requests {cfg['max_ongoing_requests']}, "
        f"max_queued_requests {cfg['max_queued_requests']}; batching: max_batch_size "
        f"{cfg['max_batch_size']}, max_batch_tokens {cfg['max_batch_tokens']}, wait "
        f"{cfg['batch_wait_timeout_s'] * 1e3:.0f} ms.",
        f"Requests: mode M3, {work['candidates_per_search']:.0f} candidates, reasoning "
        f"{work['reasoning_tokens_mean']:.0f} tokens, question {work['question_tokens_mean']:.0f}"
        f" tokens, prefix {work['prefix_tokens_M3_mean']:.0f} tokens, documents "
        f"{work['doc_tokens_mean']:.0f} tokens on average; {work['searches']} distinct requests "
        f"cycled. Reasoning: {work['reasoning']}.",
        f"Served vs in-process log-odds, largest difference: {report['served_max_abs_diff']:.2e}.",
        "",
        "| setting | clients | requests | req/s | candidates/s | p50 ms | p99 ms | "
        "requests per batch | 503 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for when, inproc in zip(("before", "after"), report["in_process"]):
        lines.append(
            f"| in-process `Scorer.score` ({when}) | 1 | {inproc['requests']} | "
            f"{inproc['requests_per_s']:.2f} | {inproc['candidates_per_s']:.0f} | "
            f"{inproc['p50_ms']:.0f} | {inproc['p99_ms']:.0f} | - | - |"
        )
    for level in report["served"]:
        lines.append(
            f"| served `/v2/rerank` | {level['concurrency']} | {level['ok']} | "
            f"{level['requests_per_s']:.2f} | {level['candidates_per_s']:.0f} | "
            f"{level['p50_ms']:.0f} | {level['p99_ms']:.0f} | "
            f"{level['mean_batch_requests']:.2f} | {level['status_503']} |"
        )
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path, label: str) -> tuple[Path, Path]:
    write_report(report, out, label, markdown(report, label))
    return out / f"{label}.json", out / f"{label}.md"


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    d = BenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default=d.model,
        help="'tiny', a config under acare_ray/testing/fixtures/model_configs, or a path",
    )
    p.add_argument("--layers", type=int, default=d.layers, help="override the layer count")
    p.add_argument("--device", default=d.device)
    p.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16"])
    p.add_argument("--searches", type=int, default=d.searches)
    p.add_argument("--candidates", type=int, default=d.candidates)
    p.add_argument("--reasoning-words", type=int, default=d.reasoning_words)
    p.add_argument("--concurrency", type=int, nargs="+", default=list(d.concurrency))
    p.add_argument("--duration-s", type=float, default=d.duration_s, help="per load level")
    p.add_argument("--inprocess-s", type=float, default=d.inprocess_s)
    p.add_argument("--replica-cpus", type=float, default=d.replica_cpus)
    p.add_argument("--replica-gpus", type=float, default=d.replica_gpus)
    p.add_argument("--max-ongoing-requests", type=int, default=d.max_ongoing_requests)
    p.add_argument("--max-queued-requests", type=int, default=d.max_queued_requests)
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    p.add_argument("--batch-wait-timeout-s", type=float, default=d.batch_wait_timeout_s)
    p.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--name")
    p.add_argument("--out", default=d.out)
    a = p.parse_args(argv)
    return BenchConfig(
        model=a.model,
        layers=a.layers,
        device=a.device,
        dtype=a.dtype,
        searches=a.searches,
        candidates=a.candidates,
        reasoning_words=a.reasoning_words,
        concurrency=tuple(a.concurrency),
        duration_s=a.duration_s,
        inprocess_s=a.inprocess_s,
        replica_cpus=a.replica_cpus,
        replica_gpus=a.replica_gpus,
        max_ongoing_requests=a.max_ongoing_requests,
        max_queued_requests=a.max_queued_requests,
        max_batch_size=a.max_batch_size,
        batch_wait_timeout_s=a.batch_wait_timeout_s,
        max_batch_tokens=a.max_batch_tokens,
        seed=a.seed,
        name=a.name,
        out=a.out,
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    report = run(cfg)
    json_path, md_path = write(report, Path(cfg.out), cfg.label)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
