"""When the target's verify pass, not the draft, decides the speed-up: measure it from a run and say what helps.

Speculative decoding assumes the target scores γ + 1 positions for about the price of one. On CPUs that holds in
bf16 (oneDNN's bf16 matmul over 5 rows costs about one row) but not in fp32, where torch's matmul (MKL sgemm)
over 2-16 rows costs 2-2.7x one row at the shapes of 1-2B models (benchmarks/bench_fp32_linear.py measures it;
a prepacked oneDNN fp32 weight gets closer, at the price of a second fp32 copy of every weight). A float32
target of that size then gains little, and loading it in bfloat16 is the remedy.

`verify_ratio` prices a run's mean target pass against the plain run's time per token (the one-token step
plus sampling, measured beside it); the first pass also reads the prompt, so for short runs the ratio is a
little high. `advice` turns a ratio above VERIFY_BOTTLENECK into one line for the CLI and the dashboard.
"""

from __future__ import annotations

VERIFY_BOTTLENECK = 1.5  # verify pass / one-token step above which the verify pass is called the bottleneck


def verify_ratio(stats, baseline) -> float | None:
    """Mean target pass of a speculative run over plain decoding's time per token (None without a baseline)."""
    if baseline is None or not baseline.new_tokens or not baseline.time_total or not stats.target_passes:
        return None
    step = baseline.time_total / baseline.new_tokens
    return (stats.time_target / stats.target_passes) / step if step > 0 else None


def advice(stats, baseline, dtype=None) -> str | None:
    """One line recommending bfloat16 when the verify pass costs over VERIFY_BOTTLENECK one-token steps, with the
    measured ratio; None otherwise. `dtype`: the target's, when known (a bf16 target gets no such advice)."""
    ratio = verify_ratio(stats, baseline)
    if ratio is None or ratio <= VERIFY_BOTTLENECK:
        return None
    name = str(dtype).replace("torch.", "") if dtype is not None else None
    if name in ("bfloat16", "float16"):
        return None
    return (f"verify pass {ratio:.1f}× a one-token step: the target's pass over γ+1 positions limits the "
            f"speed-up; float32 matmuls over several rows are slow on CPUs, bfloat16 ones are not: try "
            f"--dtype bfloat16 (or, in Python, hfspec.fast_linear.prepack(target): a second fp32 copy of the "
            f"weights)")
