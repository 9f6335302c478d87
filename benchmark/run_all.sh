#!/usr/bin/env bash
# Reproduce results/ (2-core CPU: ~15 min without the full multiturn preset, ~1 h with).
#   bash benchmark/run_all.sh [--with-full]
# Peers (vLLM CPU, transformers serve) need: bash benchmark/peers/setup_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
R=results
SMALL="$($PY -m sglang_dev.tiny_models --size small)"
$PY -m benchmark.multiturn_image --quick --repeats 3 --engines ours,vllm,hf --out $R/multiturn_image_quick
$PY -m benchmark.serving_throughput --quick --num-prompts 32 --engines ours,vllm,hf --out $R/serving_throughput_quick
$PY -m benchmark.vit_per_chunk --out $R/vit_per_chunk
$PY -m benchmark.constraint_cost --out $R/constraint_cost
$PY -m benchmark.detokenize --out $R/detokenize
$PY -m benchmark.prefill_attention --out $R/prefill_attention
$PY -m benchmark.vision_attention --encode --out $R/vision_attention
$PY -m benchmark.image_limit --quick --cap 24 --out $R/image_limit_quick
$PY -m benchmark.embed_corpus --out $R/embed_corpus_full
$PY -m benchmark.ocrbench_synth --out /tmp/ocrbench-synth --count 40
$PY -m benchmark.ocrbench --data /tmp/ocrbench-synth --model-path "$SMALL" --max-tokens 16 --out $R/ocrbench_synth
$PY -m benchmark.profile_server --resolution 1280x720 --out $R/profile_server_720p
TINY_Q2="$($PY -m benchmark.bench_models)"
S=$R/speed
$PY -m benchmark.multiturn_image --resolutions 1280x720,1920x1080 --modes per-image --engines ours,vllm --repeats 3 --out $S/multiturn_small
$PY -m benchmark.multiturn_image --resolutions 1280x720 --modes per-image --engines ours,vllm --repeats 3 --model-path "$TINY_Q2" --out $S/multiturn_tiny_qwen2_vl
$PY -m benchmark.serving_throughput --quick --num-prompts 32 --max-concurrency 4 --modes per-image --engines ours,vllm --out $S/throughput_c4
$PY -m benchmark.serving_throughput --quick --num-prompts 32 --max-concurrency 16 --modes per-image --engines ours,vllm --out $S/throughput_c16
if [ "${1:-}" = "--with-full" ]; then
  $PY -m benchmark.multiturn_image --preset full --engines ours,vllm,hf --out $R/multiturn_image_full
fi
