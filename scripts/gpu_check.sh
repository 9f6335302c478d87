#!/usr/bin/env bash
# The CUDA checks, in one call of under 8 minutes on a machine with an NVIDIA GPU:
#   1. test/test_cuda.py: greedy parity with HF on the GPU (float32, token for token), bfloat16
#      within HF's own half-precision noise (chunked, cached, a dropped image caught), pinned
#      non-blocking feature moves timed with CUDA events, flash vision attention, sampling;
#   2. test/test_kv_fp8.py and test/test_video.py unchanged: their engines take the GPU (the
#      default device where torch sees one), HF's references stay on the CPU;
#   3. multiturn_image at 1280x720, 8 rounds, per-image and combined cache modes, on a
#      Qwen2.5-VL-7B-shaped checkpoint (random bfloat16 weights drawn on the GPU).
# Results go to OUT_DIR (default out/gpu_check): gpu_check.json (the summary), cuda_tests.json
# (the tests' measurements), cuda_tests.xml, gpu_suites.xml, multiturn_image_gpu.{json,md,png}, gpu_check.log.
#
#     scripts/gpu_check.sh [OUT_DIR]
#
# Packages: the machine's own torch is used as it is (the project asks torch>=2.4). Wheels in
# .whl/ (scripts/gpu_wheels.sh downloads them for the machine's Python) are installed into
# /tmp/site, first on PYTHONPATH: the packages the image lacks (fastapi, uvicorn, pyzmq, ...) and
# transformers 5.23.0, the project's pin, in place of the image's own transformers.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-out/gpu_check}")
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  echo "installing $(ls .whl | wc -l) wheels into /tmp/site"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/python:$PWD:${PYTHONPATH:-}
export SGLANG_CACHE_DIR=${SGLANG_CACHE_DIR:-/dev/shm/sglang-cache}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, transformers; print('torch', torch.__version__, '| transformers',
transformers.__version__, '|', torch.cuda.get_device_name(0))" || exit 1

started=$SECONDS
SGLANG_GPU_REPORT=$OUT/cuda_tests.json timeout "${TESTS_TIMEOUT:-200}" \
  $PY -m pytest -q -rs -m cuda test/test_cuda.py -p no:cacheprovider \
  --junitxml="$OUT/cuda_tests.xml"
tests_rc=$?
tests_s=$((SECONDS - started))

started=$SECONDS
timeout "${SUITES_TIMEOUT:-150}" $PY -m pytest -q -rs test/test_kv_fp8.py test/test_video.py \
  -p no:cacheprovider --junitxml="$OUT/gpu_suites.xml"
suites_rc=$?
suites_s=$((SECONDS - started))

started=$SECONDS
checkpoint=$(timeout "${BUILD_TIMEOUT:-100}" $PY -m benchmark.memory --shape 7b --build-only | tail -1)
timeout "${BENCH_TIMEOUT:-200}" $PY -m benchmark.multiturn_image --model-path "$checkpoint" \
  --resolutions 1280x720 --rounds 8 --dtype bfloat16 --modes per-image,combined --no-probe \
  --server-args "--mem-fraction-static 0.6" --out "$OUT/multiturn_image_gpu"
bench_rc=$?
bench_s=$((SECONDS - started))

$PY scripts/gpu_summary.py "$OUT" --tests-rc $tests_rc --tests-s $tests_s \
  --suites-rc $suites_rc --suites-s $suites_s \
  --bench-rc $bench_rc --bench-s $bench_s
[ $tests_rc -eq 0 ] && [ $suites_rc -eq 0 ] && [ $bench_rc -eq 0 ]
