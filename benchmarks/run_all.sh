#!/usr/bin/env bash
# Run every benchmark script one after another (never in parallel: they time each other) and write ONE dated
# results file per machine: results/<machine>-<YYYY-MM-DD>.md (machine = a short CPU model string + cores, from
# common.machine_name), each script's output under its own heading with the command that made it. Scripts that
# time plain against speculative decoding do it through the one ruler (hfspec.measure, via common.timed_rounds /
# against_plain / hfspec.measure.benchmark.compare_methods): interleaved rounds, a warm-up round not counted, medians with
# intervals, outliers re-measured, a stability verdict and "implausible" flags in their rows; single operators
# (steps, F.linear) through common.time_operators (the same rounds, intervals and verdict).
# tests/test_benchmarks_harness.py checks that every bench_*.py is run here with arguments its parser accepts.
# Needs ../shared/models (stories260K) and SmolLM2-135M made by ../shared/models/get-smollm2.sh into $SMOLLM2;
# a script whose models are missing skips them and says so. A failing script is recorded and the rest still run.
set -uo pipefail
cd "$(dirname "$0")"
OUT="${OUT:-results}"
SMOLLM2="${SMOLLM2:-$HOME/.cache/hfspec-models/smollm2-135m-instruct}"
# the honest target: SmolLM2 moved off the rtn4 grid (seeded; offgrid.py's docstring says how and what it costs)
OFFGRID="${OFFGRID:-$HOME/.cache/hfspec-models/smollm2-135m-instruct-offgrid}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
MACHINE="$(python -c 'import common; print(common.machine_name())')"
FILE="$OUT/$MACHINE-$(date +%F).md"
TMP="$(mktemp -d)"
{
  echo "# Benchmarks on $MACHINE, $(date +%F)"
  echo
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') · $(nproc) cores ·" \
       "load at start $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) · hfspec $(git -C .. rev-parse --short HEAD)"
} > "$FILE"

run() {  # run <title> <command...>: its output (stdout and stderr) into the file under a heading
  local title="$1"; shift
  echo "== $title" >&2
  {
    echo; echo "## $title"; echo; echo '```'; echo "\$ $*"
    ( "$@" ) 2>&1 | tee /dev/stderr | grep -v '\r'
    echo "(exit $?, load after $(cut -d' ' -f1 /proc/loadavg 2>/dev/null))"; echo '```'
  } >> "$FILE"
}

[ -f "$OFFGRID/model.safetensors" ] || python offgrid.py "$SMOLLM2" "$OFFGRID" --report >&2
run steps python bench_steps.py --models micro,stories260K,smollm2 --smollm2 "$SMOLLM2" --draft rtn4 --gamma 4
run "verify width" python bench_verify_width.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" \
    --dtypes float32,bfloat16 --widths 1,2,5,8,16,24,32
run "round costs by γ" python bench_round_costs.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" --dtypes float32,bfloat16 \
    --temperatures 0,1 --gammas 2,3,4,5,6,7,8 --out "$TMP/round-costs"
run "greedy γ policies replayed" python bench_gamma_replay.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" \
    --dtypes float32,bfloat16 --costs "$TMP/round-costs.json"
run "tree level rows" python bench_level_rows.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" --rows 1,2,4,8,16
run "compiled pair catch-up" python bench_pair.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" --dtypes bfloat16,float32 \
    --temperatures 0,1 --draft gptq4-compiled --gamma 4 --repeats 6
run "draft step memory" python bench_draft_memory.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" \
    --dtypes bfloat16,float32 --drafts gptq4-compiled,gptq4,int8-compiled --steps 15
run engine python bench_engine.py --models micro,stories260K,smollm2 --smollm2 "$SMOLLM2" \
    --draft rtn4,rtn4-compiled --gamma 4 --max-new-tokens 128 --repeats 5
run "hfspec run --preset micro-rtn4 (3 runs)" bash -c 'cd .. && for i in 1 2 3; do hfspec run --preset micro-rtn4 \
    | grep -E "acceptance|c \(time|speed-up|^  "; done'
run lookup python bench_lookup.py --models micro --repeats 5 --max-new-tokens 128
run vocab_overhead python bench_vocab_overhead.py
run "sweep micro" bash -c "cd .. && hfspec sweep --preset micro-rtn4 --drafts rtn4-compiled,rtn4,rtn3-compiled,presets/models/nano \
    --gammas 1-8 --temperature 1 --prompt 'The attention' --max-new-tokens 200 --seed 1 --repeats 5 \
    --csv '$TMP/sweep_micro.csv' --plot 'benchmarks/$OUT/$MACHINE-$(date +%F)-sweep.png' && cat '$TMP/sweep_micro.csv'"
run batch python bench_batch.py --models micro,smollm2 --smollm2 "$SMOLLM2" --batches 1,4,16 --draft rtn4 --gamma 4 \
    --max-new-tokens 64 --repeats 3
run "adaptive micro" python bench_adaptive.py --models micro --drafts rtn4,rtn3,../presets/models/nano --gammas 1-8 \
    --max-new-tokens 128 --repeats 3
run "adaptive smollm2" python bench_adaptive.py --models smollm2 --smollm2 "$SMOLLM2" --drafts rtn4 --gammas 1-6 \
    --max-new-tokens 96 --repeats 3
run memory python bench_memory.py --smollm2 "$SMOLLM2"
run head python bench_head.py --models micro,smollm2 --smollm2 "$SMOLLM2" --repeats 3 --max-new-tokens 128
run wrapper env HFSPEC_COMPILE_DIR="$TMP/compile" python bench_wrapper.py --models micro,smollm2 --smollm2 "$SMOLLM2" --repeats 3
run int8 python bench_int8.py --models micro,smollm2-offgrid --smollm2-offgrid "$OFFGRID" --dtypes float32,bfloat16 \
    --drafts rtn4,rtn8,int8 --steps 30
run w8a8 python bench_w8a8.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID"
run tokens python bench_tokens.py --smollm2 "$SMOLLM2"
run sibling python bench_sibling.py --pairs micro-nano,smollm2-360m/135m --repeats 5
run scale python bench_scale.py --shapes smollm2-135m --dtypes bf16 --quick --out ''  # results/scale.* stay the full run's
run tree python bench_tree.py --models micro,smollm2-offgrid --smollm2-offgrid "$OFFGRID" --draft gptq4-compiled \
    --dtypes float32,bfloat16 --trees 2 --shapes auto,24x6x4x4 --temperatures 0,1 --max-new-tokens 64 --repeats 3 \
    --eager-levels
run "compiled tree level" python bench_tree_level.py --models smollm2-offgrid --smollm2-offgrid "$OFFGRID" \
    --dtypes bfloat16,float32 --draft gptq4-compiled --widths 1,2,4,8 --steps 15
run export python bench_export.py --smollm2 "$SMOLLM2"
run hub python bench_hub.py --models smollm2 --smollm2 "$SMOLLM2"
run "drafts alpha" python bench_drafts.py alpha --model ../../shared/models/stories260K
run "drafts speed" python bench_drafts.py speed --model "$SMOLLM2"
run fp32_linear python bench_fp32_linear.py
run prefill_rows python bench_prefill_rows.py --models micro,smollm2-offgrid --smollm2-offgrid "$OFFGRID"
run results python bench_results.py --smollm2-offgrid "$OFFGRID"
run calibrated python bench_calibrated.py --models micro,smollm2-offgrid --smollm2-offgrid "$OFFGRID"
run "calibration settings" python bench_calibration_settings.py --model "$OFFGRID" --reference "$SMOLLM2"
run "distilled grids" python bench_distill.py --model "$OFFGRID" --steps 40 --lr 3e-4 --params groups
run "calibration time" python bench_calibration_time.py --cases smollm2-offgrid,shape:smollm2-1.7b  # ~15 min, 12 GiB
run "llama.cpp" python bench_llamacpp.py --smollm2 "$SMOLLM2" --smollm2-offgrid "$OFFGRID" --max-new-tokens 128 \
    --repeats 5  # skips itself (exit 0) without llama_cpp (an optional build, docs/benchmarks.md) or the GGUF
run agreement python bench_agreement.py --models micro,smollm2-offgrid --smollm2-offgrid "$OFFGRID" --gamma 4 \
    --temperatures 0,1 --max-new-tokens 128 --repeats 3
rm -rf "$TMP"
echo "wrote $FILE" >&2
