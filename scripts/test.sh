#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the test suite. Used by README and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh "gui,bnb,gguf,plot,export,test,docs"
ruff check .
SITE="$(mktemp -d)"
mkdocs build --strict --quiet --site-dir "$SITE"   # docs/ and mkdocs.yml: a broken link, anchor or nav entry fails
rm -rf "$SITE"
export QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1
# one worker per core, at most 4 (each test runs torch on one thread): on CI's 2-core AVX2 VM the suite took 27.7 min
# in one process and 15.4 min in two (7 December 2026); `-n 0` after it runs in one process
python -m pytest -q -p no:cacheprovider -n auto --maxprocesses=4 "$@"
