#!/usr/bin/env bash
# verl's trainer and agent loop, tested for real in an environment of their own: verl 0.9.1 pins transformers to
# >=5.5.3,<5.11 (memrl allows <5.20) and tensordict to <=0.10, so it never touches the main .venv.
# Steps: CPU torch first (else pip pulls a CUDA build), memrl with verl's transformers range, then verl without
# its GPU/logging dependencies (vllm, flash-attn, wandb) plus the few packages that
# `verl.experimental.agent_loop` and `verl.trainer.ppo.ray_trainer` import on a CPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VERL_VENV:-.venv-verl}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q -e ".[dev]" "transformers>=5.5.3,<5.11,!=5.6.0"
"$VENV/bin/pip" install -q --no-deps verl==0.9.1
# tensordict's own dependency pyvers caps packaging below 26 (ray's optional virtualenv wants newer; unused here).
# TransferQueue carries batches in verl's v1 trainer (trainer.use_v1=true); it needs tensordict>=0.10, so 0.10.0.
"$VENV/bin/pip" install -q "tensordict>=0.8,<=0.10.0,!=0.9.0" codetiming hydra-core cachetools torchdata TransferQueue
[ "${1:-}" = "--install-only" ] && exit 0
# Ray's temp files and sockets go to a temp dir removed on exit (the tests start and stop their own cluster).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TMPDIR="$tmp" RAY_TMPDIR="$tmp" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m verl tests/integrations
