#!/usr/bin/env bash
# The main job on the embedded default, offline: set up a venv, sweep γ on the micro pair, then one run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh "plot"
export HF_HUB_OFFLINE=1
hfspec sweep --preset micro-rtn4 --drafts rtn4-compiled,rtn3-compiled --gammas 1-8 --temperature 1 --prompt "The attention" \
    --max-new-tokens 200 --seed 1 --repeats 3 --plot sweep.png --csv sweep.csv
echo "figure: sweep.png, table: sweep.csv"
hfspec run --preset micro-rtn4
