#!/usr/bin/env bash
# docs/screenshot*.png of the real window under Xvfb (apt-get install xvfb libxcb-icccm4 libxcb-keysyms1);
# falls back to Qt's offscreen rendering without xvfb-run.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v xvfb-run >/dev/null; then
    QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1366x768x24" python scripts/screenshot.py "$@"
else
    echo "xvfb-run not found: using Qt's offscreen platform" >&2
    QT_QPA_PLATFORM=offscreen python scripts/screenshot.py "$@"
fi
