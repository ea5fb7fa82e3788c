#!/usr/bin/env bash
# Ray Serve (ray[serve] from PyPI) in a venv outside the repository, for tests/realray (make rayserve; ~510 MB).
# Once: a venv that already has it is left as it is.
set -euo pipefail
ENV_DIR="${OCRCAP_RAY_ENV:-/opt/ocrcap-ray}"
PYTHON="${PYTHON:-python3}"
if [ -x "$ENV_DIR/bin/serve" ]; then
  echo "rayserve: already in $ENV_DIR"
  exit 0
fi
"$PYTHON" -m venv "$ENV_DIR"
"$ENV_DIR/bin/pip" install --quiet "ray[serve]==2.60.0" "Pillow>=10.1"
echo "rayserve: installed in $ENV_DIR (tests/realray: make test-slow)"
