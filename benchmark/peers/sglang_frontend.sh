#!/usr/bin/env bash
# SGLang's own frontend language (@sgl.function programs through sgl.RuntimeEndpoint) against
# this project's server, from a venv of its own (never the project's dependencies).
#   bash benchmark/peers/sglang_frontend.sh [--url URL] [--model-path DIR]
# With --url it runs benchmark/peers/frontend_programs.py against that server; without, it
# starts this checkout's server (python -m sglang.launch_server with $PYTHON, default python;
# --model-path, default the embedded tiny Qwen2.5-VL) on a free loopback port and stops it after.
# The venv goes to $PEER_VENVS/sglang-frontend (default ~/.cache/sglang-bench/venvs): torch
# first (sglang's own requirement would pull a CUDA build), the modules `import sglang` needs,
# then sglang --no-deps.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${PEER_VENVS:-$HOME/.cache/sglang-bench/venvs}/sglang-frontend"
PEER_PY="${PEER_PYTHON:-python3.11}"
TORCH="torch==2.13.0"
SGLANG="sglang==0.5.23"
# What `import sglang` imports at 0.5.23 (its Requires-Dist, less the GPU stack, plus triton and
# starlette, which it imports and its GPU dependencies would have brought).
MODULES=(aiohttp IPython msgspec numpy orjson packaging pillow psutil pybase64 pydantic
  "pyzmq>=25.1.2" requests starlette tqdm triton)

url="" model=""
while [ $# -gt 0 ]; do
  case "$1" in
    --url) url="$2"; shift 2 ;;
    --model-path) model="$2"; shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

install() {
  if "$VENV/bin/python" -c "import sglang, sys; sys.exit(sglang.__version__ != '${SGLANG#*==}')" \
    2>/dev/null; then
    return
  fi
  "$PEER_PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "$TORCH"
  "$VENV/bin/pip" install -q "${MODULES[@]}" "$TORCH"
  "$VENV/bin/pip" install -q --no-deps "$SGLANG"  # last: pip then checks none of its pins
  "$VENV/bin/python" -c "import sglang; print('sglang frontend', sglang.__version__, 'ok')"
}

start_server() {
  local port log
  port="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  log="$(mktemp -t sglang-frontend-server.XXXX.log)"
  (cd "$REPO" && PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" \
    -m sglang.launch_server --host 127.0.0.1 --port "$port" --log-level warning \
    ${model:+--model-path "$model"} >"$log" 2>&1) &
  SERVER_PID=$!
  trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT
  url="http://127.0.0.1:$port"
  for _ in $(seq 300); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      cat "$log" >&2; echo "the server exited" >&2; exit 1
    fi
    if "$VENV/bin/python" -c "import requests, sys; sys.exit(requests.get('$url/health_generate', timeout=30).status_code != 200)" 2>/dev/null; then
      return
    fi
    sleep 1
  done
  echo "the server did not become ready; its log: $log" >&2
  exit 1
}

install
[ -n "$url" ] || start_server
"$VENV/bin/python" "$HERE/frontend_programs.py" --url "$url"
