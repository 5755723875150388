#!/usr/bin/env bash
# Run every benchmark one after another (never in parallel: they time each other) and keep the tables.
# Needs ../shared/models (stories260K) and SmolLM2-135M made by ../shared/models/get-smollm2.sh into $SMOLLM2.
set -euo pipefail
cd "$(dirname "$0")"
OUT="${OUT:-results}"
SMOLLM2="${SMOLLM2:-$HOME/.cache/hfspec-models/smollm2-135m-instruct}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
python bench_steps.py --models micro,stories260K,smollm2 --smollm2 "$SMOLLM2" --draft rtn4 --gamma 4 \
    | tee "$OUT/steps.md"
python bench_engine.py --models micro,stories260K,smollm2 --smollm2 "$SMOLLM2" --draft rtn4,rtn4-compiled --gamma 4 \
    --max-new-tokens 128 --repeats 3 | tee "$OUT/engine.md"
(cd .. && for i in 1 2 3; do hfspec run --preset micro-rtn4 | grep -E "acceptance|c \(time|measured sp"; done) \
    | tee "$OUT/preset_runs.txt"
python bench_lookup.py --models micro --repeats 5 --max-new-tokens 128 --json "$OUT/lookup_micro.json" \
    | tee "$OUT/lookup_micro.md"
python bench_vocab_overhead.py | tee "$OUT/vocab_overhead.md"
(cd .. && hfspec sweep --preset micro-rtn4 --drafts rtn4-compiled,rtn4,rtn3-compiled,presets/models/nano --gammas 1-8 --temperature 1 \
    --prompt "The attention" --max-new-tokens 200 --seed 1 --repeats 3 --json --csv "benchmarks/$OUT/sweep_micro.csv" \
    --plot "benchmarks/$OUT/sweep_micro.png") > "$OUT/sweep_micro.json"
python bench_batch.py --models micro,smollm2 --smollm2 "$SMOLLM2" --batches 1,4,16 --draft rtn4 --gamma 4 \
    --max-new-tokens 64 --repeats 2 | tee "$OUT/batch.md"
python bench_adaptive.py --models micro --drafts rtn4,rtn3,../presets/models/nano --gammas 1-8 \
    --max-new-tokens 128 --repeats 3 | tee "$OUT/adaptive_micro.md"
python bench_adaptive.py --models smollm2 --smollm2 "$SMOLLM2" --drafts rtn4 --gammas 1-6 \
    --max-new-tokens 96 --repeats 2 | tee "$OUT/adaptive_smollm2.md"
python bench_memory.py | tee "$OUT/memory.md"
