"""The one ruler for every measured figure and the harnesses built on it.

    ruler        interleaved timing pairs, `Measurement`, `measure_speedup` (the rule: docs/measurement.md)
    stability    machine state, the median interval, outliers
    plausible    implausible figures, prediction against measurement
    replay       greedy γ policies replayed and priced by a cost model (no clock)
    verify_cost  when the verify pass, not the draft, decides the speed-up
    sweep        γ sweeps and draft comparisons (CLI `sweep` / `compare`, the dashboard)
    benchmark    plain generate, HF assisted generation and hfspec side by side (`hfspec bench`)
    results      what runs, sweeps and comparisons return, as plain data

`hfspec.measure` re-exports the ruler's public names (`from hfspec.measure import measure_speedup`); modules
inside hfspec import from the submodules.
"""

from hfspec.measure.plausible import (
    C_TIME_MAX,
    PLAUSIBLE_SLACK,
    disagreement,
    has_prediction,
    ideal_note,
    implausible,
    speedup_bound,
)
from hfspec.measure.ruler import (
    MAX_OUTLIER_SHARE,
    ROUGH_BELOW,
    STABLE_WIDTH,
    Measurement,
    Ratio,
    Sample,
    Timed,
    Timings,
    from_timings,
    interleaved,
    measure_speedup,
    predicted_speedup,
)
from hfspec.measure.stability import (
    BUSY_SHARE,
    FREQ_CHANGE,
    LEVEL,
    OUTLIER_Z,
    MachineState,
    machine_causes,
    machine_state,
    median_interval,
    outliers,
)

__all__ = [
    "BUSY_SHARE",
    "C_TIME_MAX",
    "FREQ_CHANGE",
    "LEVEL",
    "MAX_OUTLIER_SHARE",
    "MachineState",
    "Measurement",
    "OUTLIER_Z",
    "PLAUSIBLE_SLACK",
    "ROUGH_BELOW",
    "Ratio",
    "STABLE_WIDTH",
    "Sample",
    "Timed",
    "Timings",
    "disagreement",
    "from_timings",
    "has_prediction",
    "ideal_note",
    "implausible",
    "interleaved",
    "machine_causes",
    "machine_state",
    "measure_speedup",
    "median_interval",
    "outliers",
    "predicted_speedup",
    "speedup_bound",
]
