#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the test suite. Used by README and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HFSPEC_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[gui,bnb,gguf,plot,test]"
ruff check .
export QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1
python -m pytest -q -p no:cacheprovider "$@"
