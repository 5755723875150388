"""The dashboard's session layer does not leak over many runs (200 runs, drafts alternating)."""

from __future__ import annotations

import gc
import mmap
import os
from dataclasses import replace

import pytest

from hfspec.session import RunSettings, Session

RUNS, WARM_UP = 200, 20
LIMIT = 20 * 2**20  # bytes of resident memory the 180 runs after warm-up may add


def resident_bytes() -> int:
    """Resident set size of this process, read from /proc (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc (Linux)")
def test_two_hundred_session_runs_keep_memory_flat():
    presets = pytest.importorskip("hfspec.io.presets")
    if "micro-rtn4" not in presets.list_presets():
        pytest.skip("micro-rtn4 preset absent")
    session = Session()
    base = RunSettings.from_preset("micro-rtn4", max_new_tokens=8, measure_baseline=False, ignore_eos=True)
    drafts = ("rtn4", "rtn3")
    before = 0
    for run in range(RUNS):
        if run == WARM_UP:
            gc.collect()
            before = resident_bytes()
        result = session.run(replace(base, draft=drafts[run % 2], seed=run))
        assert result.stats.new_tokens == 8
    gc.collect()
    growth = resident_bytes() - before
    assert growth <= LIMIT, f"resident memory grew by {growth / 2**20:.1f} MiB over {RUNS - WARM_UP} runs"
    assert len(session._drafts) == 2  # both drafts cached, nothing rebuilt per run


def test_the_memory_probe_sees_a_leak():
    """Negative control: holding 2 x LIMIT of touched memory shows up in `resident_bytes`."""
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("reads RSS from /proc (Linux)")
    before = resident_bytes()
    held = mmap.mmap(-1, 2 * LIMIT)  # fresh pages from the kernel, never memory the allocator already holds
    for i in range(0, len(held), 4096):
        held[i] = 1
    assert resident_bytes() - before > LIMIT
    held.close()
