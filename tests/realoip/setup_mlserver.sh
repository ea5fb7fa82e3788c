#!/usr/bin/env bash
# MLServer (Seldon's Open Inference Protocol server, from PyPI) in a venv outside the repository, for
# tests/realoip (make mlserver; ~330 MB). Once: a venv that already has it is left as it is.
set -euo pipefail
ENV_DIR="${OCRCAP_MLSERVER_ENV:-/opt/ocrcap-mlserver}"
PYTHON="${PYTHON:-python3}"
if [ -x "$ENV_DIR/bin/mlserver" ]; then
  echo "mlserver: already in $ENV_DIR"
  exit 0
fi
"$PYTHON" -m venv "$ENV_DIR"
"$ENV_DIR/bin/pip" install --quiet "mlserver==1.7.1" "Pillow>=10.1"
echo "mlserver: installed in $ENV_DIR (tests/realoip: make test-slow)"
