#!/usr/bin/env bash
# Scorer benchmark on one GPU: random-weight Qwen3 at the shapes of Qwen3-Reranker-0.6B and of a
# 4B model (acare_ray/testing/fixtures/model_configs/Qwen3-Embedding-4B), bf16, searches of 100 candidates with a
# shared prefix of 1,000 tokens and documents of 256 tokens (benchmarks/bench_gpu.py). Prints
# pairs/s and model-FLOPs utilisation (2 x non-embedding params x tokens / time / 989e12, H100/H200
# dense bf16) for ours, the strong baseline and the official recipe; each attention path eager and
# compiled; top-10 agreement with a float32 reference; a profile of one M3 search by kernel kind;
# for the 0.6B shape small-search latency (4, 16, 100 candidates) and the highest steady rate of
# 10-100-candidate searches served with P99 under 500 ms; then small searches (4 and 16
# candidates) scored one by one vs packed into shared forwards. Writes JSON + markdown to $OUT_DIR.
# Budget: under 8 minutes on a single H200 machine (model building included).
#
#   benchmarks/gpu.sh              # the GPU run
#   benchmarks/gpu.sh --reduced    # the same steps on CPU with a tiny model (tests run this)
#
# Environment: PYTHON (default .venv/bin/python, else python3); OUT_DIR (default
# benchmarks/results); WHEELS: a folder of wheels installed offline when
# torch/transformers/tokenizers/safetensors are missing on the machine. The tokenizer and the model
# configs are the repository's tests/fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=gpu
if [[ "${1:-}" == "--reduced" ]]; then
    mode=reduced
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--reduced]" >&2
    exit 2
fi

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
OUT_DIR=${OUT_DIR:-benchmarks/results}

if ! "$PYTHON" -c "import torch, transformers, tokenizers, safetensors, numpy" 2>/dev/null; then
    if [[ -z "${WHEELS:-}" ]]; then
        echo "missing packages and no WHEELS folder to install them from" >&2
        exit 1
    fi
    "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" \
        torch transformers tokenizers safetensors numpy
fi
if [[ ! -f acare_ray/testing/fixtures/qwen3_tokenizer/vocab.json ]]; then
    echo "no tokenizer at acare_ray/testing/fixtures/qwen3_tokenizer (run from a full checkout)" >&2
    exit 1
fi

configs=(Qwen3-Reranker-0.6B Qwen3-Embedding-4B)
if [[ $mode == gpu ]]; then
    "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    args=(--device cuda --dtype bfloat16 --layers 0 --prefix-tokens 1000 --doc-tokens 256
        --candidates 100 --rounds 3 --baseline-stride 2 --batch-size 16 --official-pairs 16
        --max-batch-tokens 32768 --peak-flops 989e12 --threads 0)
    latency=(--latency 4 16 100 --latency-reps 30 --serving-budget-s 45)
    limit=260
    limit4b=200
else
    # Same configs, the test model's width and 2 layers, short prompts: about a minute on CPU.
    args=(--device cpu --dtype float32 --shrink --layers 2 --prefix-tokens 160 --doc-tokens 32
        --candidates 8 --rounds 2 --baseline-stride 2 --batch-size 2 --official-pairs 2
        --max-batch-tokens 4096 --peak-flops 989e12)
    latency=(--latency 4 8 --latency-reps 3 --serving-budget-s 10)
    limit=900  # generous: shared CI machines can be heavily loaded
    limit4b=900
fi

if [[ $mode == gpu ]]; then
    pack_args=(--device cuda --dtype bfloat16 --layers 0 --candidates 4 16 --searches 32
        --prefix-tokens 1000 --doc-tokens 256 --rounds 3 --threads 0)
    pack_limit=90
else
    pack_args=(--device cpu --dtype float32 --shrink --layers 2 --candidates 4 --searches 4
        --prefix-tokens 160 --doc-tokens 32 --rounds 1)
    pack_limit=600
fi

started=$SECONDS
# Seconds: the split path against the concat path on this device, before the long run.
timeout 300 "$PYTHON" -m benchmarks.bench_gpu --smoke --device "${args[1]}"
failed=0
step() {  # a step that fails or runs over is reported; the others still run
    "$@" || { echo "== step failed (exit $?): ${*:2:3}" >&2; failed=1; }
}
# Per model, one process: bench_scorer's report (ours vs the recipes) and the paths report
# (attention paths eager and compiled, top-10 vs float32, profile; the small model adds
# single-search latency and the serving-shaped rate sweep).
step timeout "$limit" "$PYTHON" -m benchmarks.bench_gpu "${args[@]}" --workload fixed \
    --modes M0 M3 --config "${configs[0]}" --name "$mode" --out "$OUT_DIR" "${latency[@]}"
step timeout "$limit4b" "$PYTHON" -m benchmarks.bench_gpu "${args[@]}" --workload fixed \
    --modes M0 M3 --config "${configs[1]}" --name "$mode" --out "$OUT_DIR"
echo "== scorer reports done in $((SECONDS - started))s"
# Small searches in one score_many call (the online batcher's case): per search vs packed.
step timeout "$pack_limit" "$PYTHON" -m benchmarks.bench_packing "${pack_args[@]}" \
    --config "${configs[0]}" --name "packing-$mode" --out "$OUT_DIR"
echo "== done in $((SECONDS - started))s; results in $OUT_DIR"
exit $failed
