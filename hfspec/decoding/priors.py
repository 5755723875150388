"""Costs fixed before decoding: what a seeded run decides with, since its text must not depend on this run's
clock (`hfspec.decoding.gamma`, `hfspec.decoding.tree_shape`, the early exit). Each prior is a measurement taken
on a quiet machine and written here with its source; `prior_model` puts them into a `CostModel`."""

from __future__ import annotations

from dataclasses import dataclass

from hfspec.decoding.costmodel import CostModel
from hfspec.kernels.cpu import CPU_KIND_ENV, CPU_KINDS, cpu_kind  # noqa: F401 (also read from here)

# Which CPU the priors were measured on (`hfspec.kernels.cpu`): "cpu" rows, the 2-core AVX-512 EPYC VM (Zen 4);
# "cpu-avx2" rows, a 2-core AMD EPYC Zen 2 VM (no AVX-512: its int4 kernel costs nearly a row per row, its int8
# kernel and fp32 sgemm differ too); "cpu-amx" rows, a 2-core Intel Xeon VM with AMX (5 December 2026). A table
# without a row for the kind takes the "cpu" row.
CPU_KIND_DEVICES = tuple(CPU_KINDS.values())  # the device keys a CPU row may have


def _key(device: str) -> str:
    """"cpu" resolved to this CPU's kind (`cpu_kind`); any other device as it is."""
    return cpu_kind() if device == "cpu" else device

# A verify pass's marginal cost per position, in one-token target passes, before a run has timed any: what a
# seeded run decides with (its text must not depend on this run's clock). "chain": over the 2–8 positions of a
# chain's verify pass; "tree": over the 8–32 of a token tree's. On a 2-core AVX-512 CPU with SmolLM2-135M
# (benchmarks/bench_verify_width.py, quiet, 2 December 2026): fp32's multi-row sgemm costs 1.5× a step at 5
# positions (0.125 per position), 1.85× at 16 and 2.4× at 32 (≈ 0.05 per position); bf16 (oneDNN) 1.08× at 5,
# 1.32× at 16, 1.63× at 32 (≈ 0.02 per position). Off the CPU: a small slope.
VERIFY_SLOPE_PRIOR = {("cpu", "float32"): {"chain": 0.125, "tree": 0.05},
                      ("cpu", "float32+prepack"): {"chain": 0.02, "tree": 0.03},
                      ("cpu", "bfloat16"): {"chain": 0.02, "tree": 0.02},
                      ("cpu", "float16"): {"chain": 0.02, "tree": 0.02},
                      # through the few-row kernel (5 December 2026, late; benchmarks/results/epyc-2c-2026-12-05-
                      # verify-width-rows.md): fp32 0.04 a position from 2 to 8 positions (which start at 0.56 of
                      # MKL's one-token sgemv step), 0.05 from 8 to 32; bf16 0.02 from 2 to 8 (from 0.66 of oneDNN's
                      # one-token step), 0.03 from 8 to 16; fp32 from 8 to 32 0.036 since its pairs of weight rows
                      # (6 December, …-2026-12-06-verify-width-rows-pairs.md: 16 positions 1.02, 32 1.66)
                      ("cpu", "float32+rows"): {"chain": 0.04, "tree": 0.04},
                      ("cpu", "bfloat16+rows"): {"chain": 0.02, "tree": 0.03},
                      # AVX2 (4 December 2026, the verify-width run below): fp32 0.18 a position at 5, 0.07 at 16;
                      # bf16 (no instructions for it) 0.44 a position at every width; fp16 taken to be alike
                      ("cpu-avx2", "float32"): {"chain": 0.18, "tree": 0.07},
                      ("cpu-avx2", "bfloat16"): {"chain": 0.44, "tree": 0.43},
                      ("cpu-avx2", "float16"): {"chain": 0.44, "tree": 0.43},
                      # AVX2 through the few-row kernel's AVX2 body (7 December 2026, benchmarks/results/epyc-avx2-
                      # 2c-2026-12-07-verify-width.md): fp32 0.03 a position from 2 to 5 (from 0.77 of MKL's step),
                      # 0.04 from 5 to 32; bf16 0.09 a position (from 1.06 of torch's bf16 step)
                      ("cpu-avx2", "float32+rows"): {"chain": 0.03, "tree": 0.04},
                      ("cpu-avx2", "bfloat16+rows"): {"chain": 0.09, "tree": 0.10},
                      # Intel AMX (5 December 2026, benchmarks/results/xeon-2c-2026-12-05-verify-width*.md): fp32
                      # 0.125 a position at 5 (but 3 positions cost 1.07), 0.07 at 16; bf16 0.025 at 5, 0.012 at 16
                      ("cpu-amx", "float32"): {"chain": 0.125, "tree": 0.07},
                      ("cpu-amx", "float32+prepack"): {"chain": 0.125, "tree": 0.065},
                      # through the few-row kernel (`hfspec.kernels.verify_linear`; …-verify-width-rows*.md): fp32
                      # 0.05 a position at 5, 0.03 at 16; bf16 0.02 a position from 2 to 8 positions (which start at
                      # 0.71 of oneDNN's one-token step), 0.03 from 8 to 16
                      ("cpu-amx", "float32+rows"): {"chain": 0.05, "tree": 0.03},
                      ("cpu-amx", "bfloat16+rows"): {"chain": 0.02, "tree": 0.03},
                      ("cpu-amx", "bfloat16"): {"chain": 0.025, "tree": 0.012},
                      ("cpu-amx", "float16"): {"chain": 0.025, "tree": 0.012},
                      ("other", ""): {"chain": 0.005, "tree": 0.005}}


def _row(table: dict, device: str, dtype: str):
    """A prior table's entry for a device type and target dtype: a CPU dtype not listed takes fp32's, any other
    device the ("other", "") entry."""
    if device not in CPU_KIND_DEVICES:
        return table[("other", "")]
    found = _cpu_entry(table, device, dtype)
    return found if found is not None else table[("cpu", "float32")]


def _cpu_key(table: dict, device: str, dtype: str) -> tuple[str, str] | None:
    """The first key of `table` along `_cpu_keys(device, dtype)`, or None."""
    return next((key for key in _cpu_keys(device, dtype) if key in table), None)


def _cpu_entry(table: dict, device: str, dtype: str):
    """The entry of `table` at `_cpu_key`, or None."""
    key = _cpu_key(table, device, dtype)
    return None if key is None else table[key]


def _cpu_keys(device: str, dtype: str) -> list[tuple[str, str]]:
    """Where a CPU prior is looked up, in order: this kind's row for the dtype, then the AVX-512 "cpu" row; a
    dtype with a path suffix ("bfloat16+rows": the few-row kernel, not measured on every kind) then the same for
    its plain dtype; "float32+lean" (the lean target through the native C step) first its own rows, then
    "float32+rows"'s."""
    kinds = [_key(device), "cpu"]
    dtypes = [dtype, dtype.split("+")[0]] if "+" in dtype else [dtype]
    if dtype.endswith("+lean"):  # the lean target: its own curve where measured, else the few-row kernel's
        dtypes.insert(1, dtype.removesuffix("+lean") + "+rows")
    return [(kind, name) for name in dtypes for kind in kinds]


def verify_slope_prior(device: str, dtype: str, shape: str = "chain") -> float:
    """`VERIFY_SLOPE_PRIOR` for a device type and target dtype ("chain" or "tree"), by `_row`'s rule."""
    return _row(VERIFY_SLOPE_PRIOR, device, dtype)[shape]


# A draft step's time over its bytes ratio (c time / c bytes), by device, target dtype and the storage holding most
# of the draft's weights (`hfspec.decoding.trees.draft_storage`: the lean step's int4 or int8 kernel, else its float
# dtype), before a run has timed any. The mean of two quiet runs of benchmarks/bench_int8.py on the 2-core EPYC VM
# with SmolLM2-135M off the grid (2 and 3 December 2026; the VM's speed moved between them, so each cell carries a
# day-to-day spread): fp32 gptq4-compiled c 0.156 / 0.146 at bytes 0.156 (1.00 / 0.94), int8 0.243 / 0.354 at 0.25
# (0.97 / 1.42); bf16 gptq4-compiled 0.267 / 0.190 at 0.312 (0.86 / 0.61), int8 0.429 / 0.418 at 0.50 (0.86 / 0.84).
# One factor per dtype (bf16 0.85 from the first day alone) had priced the bf16 int4 step 0.265 where decoding
# measured 0.195–0.205 the second day, and seeded γ "auto" drafted γ 3 where γ 5 was 15 % faster. Other storages
# and dtypes: "other" (fp32's 1, bf16's mean of its two kernels).
# A prepacked fp32 target (`hfspec.kernels.fast_linear.prepack`, key "float32+prepack") steps in 0.86x the time
# of an unpacked one (3 December), so its draft costs 1/0.86 more of a step: fp32's factors × 1.16 (derived, not
# timed on their own).
# Timed inside decoding since (5-6 December, the same kind; benchmarks/bench_round_costs.py, SmolLM2 off the grid,
# gptq4-compiled, γ 2-7 on four prompts, target verify passes through the few-row kernel): a round's draft seconds
# are a line in the tokens it proposes, fp32 0.127 + 0.115 · k target steps (T = 1: 0.110 + 0.124 · k), bf16
# 0.171 + 0.175 · k (T = 1: 0.243 + 0.161 · k): flatter slopes than the factors timed alone (int4 0.97 fp32, 0.74
# bf16) and an intercept of about one draft step, as on the AMX Xeon. The int4 factors are now those slopes over the
# bytes ratio (0.115 / 0.156 = 0.74 fp32, 0.175 / 0.312 = 0.56 → 0.54 with T = 1's 0.52), int8's and prepack's the
# old ones scaled alike (× 0.76 fp32, × 0.73 bf16), and the intercept is `DRAFT_ROUND_PRIOR`. Timed again with them
# (6 December, benchmarks/results/epyc-2c-2026-12-06-round-costs-*.md): gptq4 fp32 0.105 + 0.122 · k (prior 0.127 +
# 0.116 · k), bf16 0.168 + 0.179 · k (0.186 + 0.169 · k); int8 fp32 0.169 + 0.220 · k (0.251 + 0.228 · k).
DRAFT_STEP_PRIOR = {("cpu", "float32"): {"int4": 0.74, "int8": 0.91, "other": 1.0},
                    ("cpu", "float32+prepack"): {"int4": 0.86, "int8": 1.06, "other": 1.16},
                    ("cpu", "bfloat16"): {"int4": 0.54, "int8": 0.62, "other": 0.8},
                    ("cpu", "float16"): {"int4": 0.54, "int8": 0.62, "other": 0.8},
                    # The AVX2 CPU (4 December 2026, SmolLM2-135M off the grid, compiled steps;
                    # benchmarks/results/epyc-avx2-2c-2026-12-04-int4.md and …-int8.md): gptq4 (int4 kernel) c 0.208
                    # at bytes 0.156 in fp32 (1.33), 0.361 at 0.312 in bf16 (1.16); int8 0.276 / 0.288 at 0.25 in
                    # fp32 (1.13), 0.502 / 0.486 at 0.50 in bf16 (0.99); eager int8 is 1.4x its compiled step. A
                    # 4-bit draft held as a bf16 copy (before its int4 layout was known there): 0.71 / 0.62.
                    ("cpu-avx2", "float32"): {"int4": 1.33, "int8": 1.13, "other": 0.71},
                    ("cpu-avx2", "bfloat16"): {"int4": 1.16, "int8": 0.99, "other": 0.62},
                    # A 4-bit draft's steps through the native C step (`hfspec.kernels.native_step`, its int4 kernel's
                    # AVX2 body), where the target's passes take the lean target (same library, so the key
                    # "float32+lean" says both run natively): timed inside decoding (7 December 2026, benchmarks/
                    # bench_round_costs.py, gptq4-compiled γ 3-6 on four prompts, …/epyc-avx2-2c-2026-12-07-round-
                    # costs-native.md) a round's draft is 0.063 + 0.107 · k HF steps greedy, 0.023 + 0.124 · k at
                    # T = 1: int4 (0.107 + 0.124) / 2 / 0.156 = 0.74 of the bytes ratio, where torch's compiled
                    # int4 step had been 1.33. int8 and float drafts do not take the native step: as above.
                    ("cpu-avx2", "float32+lean"): {"int4": 0.74, "int8": 1.13, "other": 0.71},
                    # Intel AMX (5 December 2026): the whole model sits in its 480 MB L3, so a step is priced by
                    # arithmetic, not bytes, and the packed kernels cost more per byte than fp32's sgemv. Steps timed
                    # alone (benchmarks/results/xeon-2c-2026-12-05-int8*.md): fp32 gptq4-compiled c 0.300 / 0.265 at
                    # bytes 0.156 in two runs, int8-compiled 0.433 at 0.25 (eager 0.543, before the compile check
                    # allowed its rounding), rtn8 (bf16 copy) 0.963 at 0.50; bf16 gptq4-compiled 0.235 at 0.312,
                    # int8-compiled 0.370 at 0.50, rtn8 0.789 at 1.0. Inside decoding (SmolLM2 off the grid, γ 2–6
                    # on four prompts, each round's draft seconds against γ) gptq4-compiled's draft costs a line:
                    # 0.21 of a step per token in fp32 (1.35 of its bytes ratio) and 0.19 in bf16 (0.61), plus
                    # `DRAFT_ROUND_PRIOR` per round. The int4 factors are those decoding slopes; int8's and
                    # rtn8's are their steps timed alone × int4's decoding / alone ratio (0.75 fp32, 0.81 bf16).
                    ("cpu-amx", "float32"): {"int4": 1.35, "int8": 1.29, "other": 1.44},
                    ("cpu-amx", "float32+prepack"): {"int4": 1.35, "int8": 1.29, "other": 1.44},
                    # ("float32+rows" and "bfloat16+rows", the few-row kernel, take these rows: it leaves the
                    # one-token target step, and so c, as it was)
                    ("cpu-amx", "bfloat16"): {"int4": 0.61, "int8": 0.60, "other": 0.64},
                    ("other", ""): {"other": 1.0}}


def draft_step_prior(c_bytes: float, device: str = "cpu", dtype: str = "float32", storage: str = "") -> float:
    """c, a draft step in target steps, fixed before decoding: the bytes ratio × `DRAFT_STEP_PRIOR` for the device,
    the target's dtype (a CPU dtype not listed takes fp32's factors, any other device 1) and the draft's storage
    ("int4", "int8", or anything else: "other")."""
    row = _row(DRAFT_STEP_PRIOR, device, dtype)
    return c_bytes * row.get(storage, row["other"])


# A round's draft time is a line in γ whose intercept is not 0: the round's first draft call catches up on the
# tokens the last verify pass committed (the bonus or corrected token, and a rejected draft token's replacement)
# before it proposes. In draft steps c per round, measured inside decoding where it was measured (the Intel AMX CPU,
# 5 December 2026, the run above: 0.22 of a target step per round in fp32 and 0.24 in bf16, 1.05 and 1.26 c). Without
# it a seeded γ "auto" priced short rounds too cheaply there and drafted γ 2 where γ 5 was 7 % faster (fp32,
# benchmarks/results/xeon-2c-2026-12-05-results-gamma.md). The AVX-512 EPYC ("cpu", 5-6 December, in the note above
# `DRAFT_STEP_PRIOR`): 0.127 / 0.115 = 1.1 draft steps in fp32, 0.98 in bf16 (1.5 at T = 1). Kinds not listed: 0.
# The AVX2 CPU with the native draft step (the run above the "float32+lean" row of `DRAFT_STEP_PRIOR`): 0.063 / 0.107
# = 0.59 draft steps greedy, 0.023 / 0.124 = 0.19 at T = 1; 0.4 between them.
DRAFT_ROUND_PRIOR = {"cpu": 1.1, "cpu-amx": 1.15, "cpu-avx2": 0.4}


def draft_round_prior(device: str = "cpu") -> float:
    """`DRAFT_ROUND_PRIOR` for a device type (a CPU resolved to its kind), in draft steps per round."""
    return DRAFT_ROUND_PRIOR.get(_key(device), 0.0)


# A verify pass over n positions, in one-token target passes, before a run has timed any: (n, t(n)) points,
# linear between them and past the last. Measured on the 2-core AMD EPYC VM with SmolLM2-135M (quiet,
# benchmarks/bench_verify_width.py): every width from 1 to 10 on 3 December 2026
# (benchmarks/results/epyc-2c-2026-12-03-verify-width-dense.md), 12–32 on 2 December. fp32's sgemm is dearest at
# 2–3 rows (MKL's small-M path), cheaper again at 4–6 and 8, dearer at 7 (1.71 against 1.41 at 6 and 1.40 at 8):
# a sparser curve (1, 2, 3, 5, 8, ...) had priced 7 positions between 5's and 8's and sent fp32 γ "auto" to γ 6,
# where a fixed γ 4 is faster; bf16 grows slowly. Other devices and dtypes: the line of `verify_slope_prior`.
VERIFY_CURVE_PRIOR = {
    ("cpu", "float32"): ((1, 1.0), (2, 1.64), (3, 1.91), (4, 1.41), (5, 1.32), (6, 1.41), (7, 1.71), (8, 1.40),
                         (9, 1.57), (10, 1.58), (12, 1.72), (16, 1.85), (24, 2.15), (32, 2.43)),
    # prepacked fp32 (oneDNN for every row; 3 December, benchmarks/results/epyc-2c-2026-12-03-verify-width-prepack.md):
    # over its own one-token step, which is 0.86x an unpacked one
    ("cpu", "float32+prepack"): ((1, 1.0), (2, 1.14), (3, 1.10), (4, 1.06), (5, 1.08), (6, 1.12), (7, 1.20), (8, 1.19),
                                 (9, 1.24), (10, 1.30), (16, 1.45), (24, 1.81), (32, 1.98)),
    # bf16: from 1 to 10 positions the least-squares line through (1, 1) of that run's points (1.03, 1.07, 1.10,
    # 1.16, 1.20, 1.15, 1.18, 1.21, 1.24 at 2–10: slope 0.0285 a position), since its bumps lie inside their
    # intervals (6 positions 1.20 [1.09–1.27], 7 positions 1.15 [1.11–1.18]): priced point by point, 7 positions
    # cheaper than 6 made seeded γ "auto" jump from γ 3 to γ 6 as α crossed 0.84 and never draft 4 or 5 (3 December,
    # gptq4-compiled; fixed γ 4 and 5 were 10–17 % faster than that run). Then the measured 16, 24 and 32.
    ("cpu", "bfloat16"): ((1, 1.0), (10, 1.2565), (16, 1.32), (24, 1.44), (32, 1.63)),
    # With the target's 2-32-row fp32 and 2-16-row bf16 linears through the few-row kernel (`hfspec.kernels.
    # verify_linear`, which a speculative decode uses on this kind), over the one-token step plain decoding takes
    # (MKL's sgemv, oneDNN), 5 December 2026, late (benchmarks/results/epyc-2c-2026-12-05-verify-width-rows.md,
    # 20 interleaved rounds, every kernel point within ±5 %): MKL is slow on this AMD CPU (its own fp32 curve was
    # 1.57 at 2 positions and 1.31 at 5 in that run, as on 3 December), so a pass over 2-12 positions costs less
    # than plain decoding's one-token step (fp32 5 positions 0.64, bf16 0.78). bf16 past 16 positions is oneDNN's
    # (the kernel stops there), as measured in that run. fp32 from 12 positions on is the kernel with pairs of weight
    # rows (6 December, benchmarks/results/epyc-2c-2026-12-06-verify-width-rows-pairs.md, beside the single-row body
    # in the same session: 12 positions 0.88 against 0.91, 16 1.02 against 1.22, 24 1.30 against 1.56, 32 1.66
    # against 2.01; 2-8 positions alike within their intervals, so those points stay).
    ("cpu", "float32+rows"): ((1, 1.0), (2, 0.56), (3, 0.59), (4, 0.65), (5, 0.64), (6, 0.70), (8, 0.80), (12, 0.88),
                              (16, 1.02), (24, 1.30), (32, 1.66)),
    # bf16 from 2 to 8 positions is the line that verify passes cost inside decoding (6 December,
    # benchmarks/results/epyc-2c-2026-12-06-round-costs-gptq4-bfloat16.md and …-round-costs-int8.md: 0.70-0.78 of a
    # step a round for 3-8 positions, greedy and T = 1, in no order), not the points timed alone (3 positions 0.68,
    # 4 0.77): that step made a seeded γ "auto" jump from γ 2 at α 0.78 to γ 5 at 0.80, and at T = 1, where α sits
    # there, it drafted γ 2 for most rounds (3.28 tokens a pass against γ 5's 4.23).
    ("cpu", "bfloat16+rows"): ((1, 1.0), (2, 0.71), (3, 0.72), (4, 0.73), (5, 0.74), (6, 0.75), (8, 0.77), (12, 0.90),
                               (16, 1.04), (24, 1.58), (32, 1.77)),
    # The AVX2 CPU (AMD EPYC Zen 2, 4 December 2026, benchmarks/results/epyc-avx2-2c-2026-12-04-verify-width.md, every
    # point within ±4 %): fp32 much like AVX-512's (2.08× at 16); bf16, which this CPU has no instructions for, costs
    # 0.44 of a step per position (5 positions 2.77×, 16 positions 7.4×), though one position is the cheapest step.
    ("cpu-avx2", "float32"): ((1, 1.0), (2, 1.46), (3, 1.73), (4, 1.70), (5, 1.70), (6, 1.72), (7, 1.85), (8, 1.82),
                              (9, 1.97), (10, 1.97), (12, 1.96), (16, 2.08), (24, 2.27), (32, 2.54)),
    # Intel AMX (5 December 2026, benchmarks/results/xeon-2c-2026-12-05-verify-width-dense.md for 1–12,
    # …-verify-width.md for 16–32): fp32's sgemm is cheap up to 3 rows, then jumps (4 positions 1.44); bf16 is flat
    # (1.10 at 5, 1.18 at 16), though its one-token step is 1.17x fp32's. Prepacked fp32 (oneDNN from 4 rows, MKL
    # below: its one-row product is 1.3x sgemv here) over the unpacked one-token step.
    # fp32's 3–7 positions as decoding measured them (the verify passes of the two γ 2–6 runs that fitted
    # `DRAFT_ROUND_PRIOR`: 1.09 / 1.14, 1.50 / 1.52, 1.54 / 1.67, 1.54 / 1.60, 1.74 / 1.79), a little dearer than alone.
    ("cpu-amx", "float32"): ((1, 1.0), (2, 1.02), (3, 1.12), (4, 1.51), (5, 1.60), (6, 1.57), (7, 1.76), (8, 1.79),
                             (9, 1.84), (10, 1.97), (12, 2.06), (16, 2.05), (24, 2.27), (32, 2.44)),
    ("cpu-amx", "float32+prepack"): ((1, 1.0), (2, 1.02), (3, 1.07), (5, 1.51), (8, 1.69), (16, 1.97), (24, 2.26),
                                     (32, 2.44)),
    # With the target's 2-32-row fp32 and 2-16-row bf16 linears through the few-row kernel (`hfspec.kernels.
    # verify_linear`, which a speculative decode uses on this kind), over the one-token step plain decoding takes
    # (sgemv, oneDNN): fp32 1–12 from benchmarks/results/xeon-2c-2026-12-05-verify-width-rows.md (every point within
    # ±3 %), 16–32 from …-verify-width-rows-uncapped.md: 5 positions 1.22 against sgemm's 1.56, 16 1.44 against
    # 1.98. bf16 from …-uncapped.md up to 16 positions, past them oneDNN's (the bf16 row above): a pass over 2–8
    # positions costs 0.71–0.88 of oneDNN's one-token step, which reads the weights at half the speed.
    ("cpu-amx", "float32+rows"): ((1, 1.0), (2, 1.05), (3, 1.13), (4, 1.14), (5, 1.22), (6, 1.23), (7, 1.26), (8, 1.29),
                                  (9, 1.32), (10, 1.33), (12, 1.37), (16, 1.44), (24, 1.98), (32, 2.37)),
    ("cpu-amx", "bfloat16+rows"): ((1, 1.0), (2, 0.71), (3, 0.74), (4, 0.76), (5, 0.78), (6, 0.82), (8, 0.88),
                                   (12, 1.02), (16, 1.14), (24, 1.26), (32, 1.29)),
    ("cpu-amx", "bfloat16"): ((1, 1.0), (2, 1.07), (5, 1.10), (8, 1.12), (12, 1.15), (16, 1.18), (24, 1.26),
                              (32, 1.29)),
    ("cpu-avx2", "bfloat16"): ((1, 1.0), (2, 1.44), (3, 1.88), (4, 2.31), (5, 2.77), (6, 3.20), (7, 3.66), (8, 4.10),
                               (10, 4.88), (12, 5.80), (16, 7.37), (24, 10.67), (32, 13.93)),
    # The AVX2 CPU through the few-row kernel's AVX2 body (7 December 2026, benchmarks/results/epyc-avx2-2c-2026-12-07-
    # verify-width.md, 12 and 8 interleaved rounds; 16 positions the mean of the two runs, 1.32 and 1.34), over MKL's
    # one-token step: MKL's multi-row sgemm cost 1.70 at 5 positions in the same rounds. bf16 past 16 positions is
    # torch's own (the kernel stops there), as on 4 December. fp32 retaken at every width once the AVX2 body took
    # 7-12 rows in one chunk (…/epyc-avx2-2c-2026-12-07-verify-width-chunk12.md): 8 positions 0.94 (was 1.09).
    ("cpu-avx2", "float32+rows"): ((1, 1.0), (2, 0.77), (3, 0.84), (4, 0.81), (5, 0.84), (6, 0.89), (7, 0.88),
                                   (8, 0.94), (10, 1.01), (12, 1.11), (16, 1.38), (24, 1.75), (32, 2.01)),
    ("cpu-avx2", "bfloat16+rows"): ((1, 1.0), (2, 1.06), (3, 1.14), (5, 1.33), (8, 1.60), (16, 2.59), (24, 10.67),
                                    (32, 13.93)),
    # The lean target (`hfspec.kernels.lean_target`: the target's own fp32 weights through hfspec's lean decoder, 1-16
    # positions a pass through the native C step, `hfspec.kernels.native_step`), over the HF forward's one-token step
    # that plain decoding takes, in the same rounds as the rows above: one position 0.40, five 0.42 (the HF forward's
    # layers cost as much again around their products on this CPU); 16 positions the mean of 0.96 and 1.13. Priced
    # here, a verify pass is several times a draft step's share, so γ "auto" drafts shorter rounds than "+rows" says.
    # 1-16 positions every width from a denser run the same afternoon (…/epyc-avx2-2c-2026-12-07-verify-width-lean-
    # dense.md, 12 rounds): flat to 6 positions (0.35-0.43), then a step to 0.59 at 7, where the kernel's AVX2 body
    # took 7 rows of x as two chunks (4 + 3) over each block of weights. Since then it takes 7-12 rows in one chunk,
    # one row of weights at a time (pairs of weight rows only up to 6 rows of x: 16 registers); the points now are the
    # mean of two runs with that body (…-verify-width-chunk12.md, 12 rounds, and a 20-round run not kept), 1-6
    # positions (the same code as before) the mean of that run and the dense one: 7 positions 0.45 (was 0.59), 8 0.49
    # (0.63), 12 0.63 (0.71), 16 0.84 (1.00).
    ("cpu-avx2", "float32+lean"): ((1, 0.40), (2, 0.37), (3, 0.36), (4, 0.39), (5, 0.40), (6, 0.42), (7, 0.45),
                                   (8, 0.49), (10, 0.55), (12, 0.63), (16, 0.84), (24, 1.42), (32, 1.82)),
    # The same on the 2-core Intel Xeon without AMX (7 December 2026, …/xeon-noamx-2c-2026-12-07-verify-width-native.md,
    # 15 rounds): 2 positions 0.57, 5 0.65, 8 0.73, 16 1.28 of the HF forward's step (one position 0.83 in that file;
    # docs/benchmarks.md's table gives 0.52). Taken for the AVX-512 kinds ("cpu", and "cpu-amx", the same Xeon with AMX
    # shown, whose fp32 products do not use it), which run the same AVX-512 body of the kernel: without it the Xeon priced
    # lean passes by the EPYC's "+rows" curve, 16 positions 1.6× of 5 where they cost 2×, and a seeded tree="auto" grew
    # trees that did not pay (fp32, T = 1: 0.88× of the best chain, docs/trees.md); the AMX Xeon priced them by its own
    # "+rows" curve (5 positions 1.22 steps, against 0.65 through the lean target). Not measured on the Zen 4 EPYC.
    ("cpu", "float32+lean"): ((1, 0.83), (2, 0.57), (4, 0.62), (5, 0.65), (6, 0.67), (8, 0.73), (16, 1.28)),
}


def verify_prior(n: int, device: str = "cpu", dtype: str = "float32") -> float:
    """t(n) / t(1) before a run has timed any (`VERIFY_CURVE_PRIOR`, else 1 + slope · (n − 1))."""
    points = _cpu_entry(VERIFY_CURVE_PRIOR, device, dtype) if device in CPU_KIND_DEVICES else None
    if not points:
        return 1.0 + verify_slope_prior(device, dtype, "chain") * (n - 1)
    for (n0, t0), (n1, t1) in zip(points, points[1:], strict=False):
        if n <= n1 or (n1, t1) == points[-1]:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    return points[-1][1]


# The least a kernel pass of 2 or more positions was timed at alone, where the curve above is not those points (the
# EPYC's bf16 curve is decoding's line): 3 positions 0.57 of a step (6 December, …-verify-width-rows-pairs.md).
VERIFY_FLOOR_PRIOR = {("cpu", "bfloat16+rows"): 0.57}
# The least a pass through the lean target (`hfspec.kernels.lean_target`) costs in the HF forward's one-token steps:
# through the native C step (`hfspec.kernels.native_step`) one position 0.52, 2 positions 0.56, 5 positions 0.64
# (SmolLM2-135M fp32, 2-core Xeon without AMX, 7 December 2026, `bench_verify_width.py --dtypes float32+lean`,
# …-verify-width-native.md; without the native step 0.82-0.98, …-verify-width-lean.md); on the AVX2 EPYC, where the
# HF forward's step is slower, 2 positions 0.33 and 3 0.35 (7 December 2026, …/epyc-avx2-2c-2026-12-07-verify-width.md):
# a bound a little under.
LEAN_TARGET_FLOOR = 0.3


def verify_floor(dtype: str, device: str = "cpu") -> float:
    """The least a verify pass of 2 or more positions through the few-row kernel costs in plain one-token steps on
    this CPU kind (the lowest point of its "+rows" `VERIFY_CURVE_PRIOR`, or `VERIFY_FLOOR_PRIOR` if lower; 1.0 where
    none is measured): the floor the plausibility check (`hfspec.measure.plausible.speedup_bound`) prices a verify
    pass at, instead of one step."""
    key = _cpu_key(VERIFY_CURVE_PRIOR, device, dtype + "+rows") if device in CPU_KIND_DEVICES else None
    if key is None:
        return 1.0
    return min([1.0, VERIFY_FLOOR_PRIOR.get(key, 1.0)] + [t for n, t in VERIFY_CURVE_PRIOR[key] if n >= 2])


@dataclass
class PriorModel(CostModel):
    """`CostModel` whose verify pass follows `verify_prior` for a device and dtype instead of a line."""

    device: str = "cpu"
    dtype: str = "float32"

    def verify(self, n: int) -> float:
        return verify_prior(n, self.device, self.dtype) * self.step


def prior_model(c: float, device: str = "cpu", dtype: str = "float32") -> CostModel:
    """A cost model fixed before decoding, in units of one target step: a draft step costs c (`draft_step_prior`)
    and a round's drafting `draft_round_prior` · c more, the verify pass t(n) = `verify_prior(n)`, nothing outside
    forwards. What γ "auto" decides with in a seeded run
    (`hfspec.decoding.gamma.AdaptiveGamma(profile=…)`)."""
    s = verify_slope_prior(device, dtype, "chain")
    c = max(0.0, c)
    return PriorModel(step=1.0, verify_a=1.0 - s, verify_b=s, draft_a=c * draft_round_prior(device), draft_b=c,
                      draft_zero=0.0, other_a=0.0, other_b=0.0, plain_other=0.0, source="prior fixed before decoding",
                      device=device, dtype=dtype)


# A token tree's round against the chain's, before a run has timed any: what a seeded tree="auto" prices a tree
# round with when it chooses between growing a tree and running the round as the chain (`hfspec.decoding.tree_choice`).
# A tree level is one draft call over several nodes (tree mask, explicit positions), where the chain's step takes one
# token: `TREE_LEVEL_PRIOR` is a one-node level's cost over the chain's draft step, by what runs each. A compiled
# draft compiles its tree level too (`hfspec.kernels.compiled_tree`; a one-node level is padded to two nodes), else
# its levels run the eager lean step: "eager over compiled". Measured with benchmarks/bench_tree_level.py (gptq4-compiled,
# SmolLM2-135M off the grid, quiet no-AMX 2-core Xeon, 7 December 2026, benchmarks/results/xeon-noamx-2c-2026-12-07-
# tree-level.md): see the numbers beside each value. "eager" (an eager level over an eager draft's step) is inferred
# from the 2 December 2026 rows of benchmarks/results/epyc-2c-2026-12-02-results-readme.json (SmolLM2-135M off the
# grid, quiet 2-core EPYC), where int8 tree runs took 1.00–1.08× the chain's time per draft forward.
# A tree round also builds a 4-D mask and position ids for its verify pass and walks the tree in Python:
# `TREE_ROUND_PRIOR`, in one-token target passes per round, on top of the verify pass `verify_prior(n)` prices (from
# the same EPYC rows: at equal tokens per pass a tree round cost about 0.19 target passes more than a chain round, of
# which its levels explain about 0.13).
TREE_LEVEL_PRIOR = {"compiled": 1.2, "eager over compiled": 1.55, "eager": 1.1}
TREE_ROUND_PRIOR = 0.06

# A tree level's cost grows with its nodes: each node is a row of every draft matrix's product, and the CPU's
# packed int4 and int8 kernels cost nearly a row's worth per row (a level of 8 nodes 3.3× one node with int4 at
# SmolLM2-135M's shapes, 2.6× with int8; dense bf16 1.3×, fp32 1.7×). `TREE_ROW_PRIOR`, by the storage that holds
# most of the draft's weights: one more node's cost in units of a one-node level (the per-node slope at 8 rows),
# so a seeded level of w nodes costs `tree_level_prior` × (1 + row × (w − 1)) draft steps
# (benchmarks/bench_level_rows.py, quiet 2-core EPYC, 3 December 2026,
# benchmarks/results/epyc-2c-2026-12-03-level-rows.md). Without it a level was priced as one node whatever its
# width, and seeded tree="auto" grew 8-wide levels of an int8 draft in bf16 at T = 1 where the chain was faster
# (1.47× against 1.73×).
TREE_ROW_PRIOR = {"int4": 0.33, "int8": 0.23, "bfloat16": 0.04, "float32": 0.10}
# The same on the AVX2 CPU ("cpu-avx2", 4 December 2026, benchmarks/results/epyc-avx2-2c-2026-12-04-level-rows.md,
# the slope at 8 rows): int4 0.31, int8 0.19 (4 rows cost only 1.15x one there), fp32 0.18; bf16, which has no
# instructions there, 0.82 (4 rows; the same script earlier that day, its int4 rows then a bf16 copy, not kept).
TREE_ROW_PRIOR_AVX2 = {"int4": 0.31, "int8": 0.19, "bfloat16": 0.82, "float32": 0.18}
# Intel AMX ("cpu-amx", 5 December 2026, benchmarks/results/xeon-2c-2026-12-05-level-rows.md, the slope at 8 rows):
# the packed kernels cost more than a third of a row per row; dense bf16 (AMX) almost nothing.
TREE_ROW_PRIOR_AMX = {"int4": 0.36, "int8": 0.35, "bfloat16": 0.02, "float32": 0.32}
TREE_ROW_PRIORS = {"cpu": TREE_ROW_PRIOR, "cpu-avx2": TREE_ROW_PRIOR_AVX2, "cpu-amx": TREE_ROW_PRIOR_AMX}


def tree_level_prior(compiled: bool, level_compiled: bool = False) -> float:
    """A one-node token-tree draft level's cost over the chain's draft step (`TREE_LEVEL_PRIOR`), fixed before
    decoding. compiled: the chain's step is compiled; level_compiled: so is the tree level."""
    if not compiled:
        return TREE_LEVEL_PRIOR["eager"]
    return TREE_LEVEL_PRIOR["compiled" if level_compiled else "eager over compiled"]


def tree_row_prior(storage: str) -> float:
    """One more node of a tree level, in one-node levels (`TREE_ROW_PRIOR`; a storage not listed: fp32's)."""
    table = TREE_ROW_PRIORS.get(cpu_kind(), TREE_ROW_PRIOR)
    return table.get(storage, table["float32"])
