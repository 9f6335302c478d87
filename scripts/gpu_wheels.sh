#!/usr/bin/env bash
# Download into .whl/ the wheels scripts/gpu_check.sh installs on a GPU machine that cannot reach
# a package index: what its image lacks of the project's run-time needs (the HTTP server's stack,
# pyzmq, pybase64) and transformers at the project's pin, for that machine's Python.
#
#     scripts/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${1:-3.12}" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  transformers==5.23.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
  pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing_extensions==4.16.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 pybase64==1.5.1 \
  pyzmq==27.3.0 regex==2026.11.19
ls .whl
