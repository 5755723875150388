"""When the target's verify pass, not the draft, decides the speed-up: measure it from a run and say what helps.

Speculative decoding assumes the target scores γ + 1 positions for about the price of one. On CPUs that holds in
bf16 (oneDNN's bf16 matmul over 5 rows costs about one row) but not in fp32, where torch's matmul (MKL sgemm)
over 2-16 rows costs 2-2.7x one row at the shapes of 1-2B models (benchmarks/bench_fp32_linear.py measures it;
a prepacked oneDNN fp32 weight gets closer, at the price of a second fp32 copy of every weight). A float32
target of that size then gains little, and loading it in bfloat16 is the remedy.

`verify_ratio` prices the run's most common verify width against a one-token step, both from the cost model's
record of the run (`hfspec.decoding.costmodel`: prefill apart, the step from a plain run timed beside it or one-token
passes after it). Without such a record it falls back to the mean target pass over the plain run's time per
token, which counts the prompt's prefill and sampling and so reads a little high for short runs. `advice` turns
a ratio above VERIFY_BOTTLENECK into one line for the CLI and the dashboard. On an AVX2 CPU (no AVX-512, no bf16
instructions: `hfspec.decoding.priors.cpu_kind`) bf16 is no remedy: a bf16 pass costs 0.44 of a step per position
there (benchmarks/results/epyc-avx2-2c-2026-12-04-verify-width.md), so the line says to keep or load float32.
"""

from __future__ import annotations

from hfspec.decoding.costmodel import CostModel
from hfspec.decoding.priors import cpu_kind
from hfspec.dtypes import dtype_str

VERIFY_BOTTLENECK = 1.5  # verify pass / one-token step above which the verify pass is called the bottleneck


def verify_ratio(stats, baseline) -> float | None:
    """The verify pass over a one-token step for a run (None when nothing says it)."""
    measured = _recorded_ratio(stats)
    if measured is not None:
        return measured
    if baseline is None or not baseline.new_tokens or not baseline.time_total or not stats.target_passes:
        return None
    step = baseline.time_total / baseline.new_tokens
    return (stats.time_target / stats.target_passes) / step if step > 0 else None


def _recorded_ratio(stats) -> float | None:
    """t(w) / t(1) from the cost model fitted to the run, w its most common verify width; None when the record
    holds no multi-position pass or no one-token timing."""
    record = getattr(stats, "costs", None)
    if record is None:
        return None
    widths = [(rounds, width) for width, rounds in enumerate(record.width_rounds) if width > 1 and rounds]
    plain = getattr(stats, "plain_costs", None)
    has_step = bool(record.steps) or (len(record.width_rounds) > 1 and record.width_rounds[1] > 0) or bool(
        plain is not None and len(plain.width_rounds) > 1 and plain.width_rounds[1])
    if not widths or not has_step:
        return None
    model = CostModel.fit(record, plain)
    width = max(widths)[1]
    return model.verify(width) / model.step if model.step > 0 else None


CLI_SWITCH = "--dtype bfloat16 (or keep fp32 with --prepack: a second fp32 copy of the weights)"


def advice(stats, baseline, dtype=None, switch: str = CLI_SWITCH) -> str | None:
    """One line recommending bfloat16 when the verify pass costs over VERIFY_BOTTLENECK one-token steps, with the
    measured ratio; None otherwise. `dtype`: the target's, when known (a bf16 target gets no such advice).
    `switch`: how to get bfloat16 where the line is read (the CLI's flag; the dashboard names its own control), with
    the fp32 alternative in parentheses (left out on an AMX CPU, where prepacking gains little)."""
    ratio = verify_ratio(stats, baseline)
    if ratio is None or ratio <= VERIFY_BOTTLENECK:
        return None
    name = dtype_str(dtype) if dtype is not None else (getattr(stats, "target_dtype", "") or None)
    avx2 = cpu_kind() == "cpu-avx2"
    head = f"verify pass {ratio:.1f}× a one-token step: "
    if name in ("bfloat16", "float16"):
        if not avx2:
            return None
        return (head + f"this CPU (AVX2, no AVX-512) has no {name} matmul instructions, so each position of the pass "
                "costs nearly half a step; load the target in float32 and use an int8 draft")
    limits = ("the target's pass over γ+1 positions limits the speed-up; float32 matmuls over several rows are slow "
              "on CPUs, ")
    if avx2:
        return (head + limits + "and this one (AVX2) has no bfloat16 instructions either: keep float32, and prefer a "
                "draft accepted often (int8) at a small γ")
    if cpu_kind() == "cpu-amx":  # prepacking gains little there (hfspec.kernels.fast_linear): the bf16 switch alone
        return (head + limits + "bfloat16 ones are not on this CPU (AMX), though its bfloat16 one-token step is "
                f"slower: try {switch.split(' (')[0]} and compare tokens/s")
    return head + limits + f"bfloat16 ones are not: try {switch}"
