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
python -m pytest -q -p no:cacheprovider "$@"
