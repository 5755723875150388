"""`hfspec.io.memory.kept_heap`: freed memory stays in the process inside the block and goes back after it.

Each case runs in a fresh interpreter: what a long test process has already allocated and freed decides where
glibc places the next large block (a free chunk left in its heap serves it without new pages), so resident-memory
figures are only meaningful from a clean heap."""

import json
import os
import subprocess
import sys

import pytest

from hfspec.io import memory

pytestmark = pytest.mark.skipif(memory._glibc() is None or not os.path.exists("/proc/self/statm"),
                                reason="glibc and /proc only")

SIZE = 256 << 20  # well above glibc's mmap threshold (128 KiB, at most 32 MiB when it adapts)

PRELUDE = f"""
import json, os, torch
from hfspec.io import memory
SIZE = {SIZE}
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def kept_after_free():
    '''Resident growth once a SIZE block, every page touched, is freed again (SIZE: kept; about 0: returned).'''
    before = rss()
    block = torch.ones(SIZE // 4)
    assert rss() - before > 0.9 * SIZE, "the block was not resident"
    del block
    return (rss() - before) / SIZE
out = {{}}
"""


def _run(body: str) -> dict:
    code = PRELUDE + body + "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_freed_memory_is_kept_inside_the_block_and_returned_after():
    out = _run("""
out["outside"] = kept_after_free()
with memory.kept_heap() as kept:
    out["could"] = kept
    start = rss()
    out["inside"] = kept_after_free()
out["after_leaving"] = (rss() - start) / SIZE
out["outside_again"] = kept_after_free()
""")
    assert out["could"]
    assert out["outside"] < 0.5  # the control: with glibc's rules a large block goes back as soon as it is freed
    assert out["inside"] > 0.9  # kept for the next allocation
    assert out["after_leaving"] < 0.5  # returned on leaving
    assert out["outside_again"] < 0.5  # and the old rules are back


def test_an_error_inside_still_restores_the_rules():
    out = _run("""
try:
    with memory.kept_heap():
        raise RuntimeError("boom")
except RuntimeError:
    pass
out["outside"] = kept_after_free()
""")
    assert out["outside"] < 0.5


def test_nested_blocks_keep_until_the_outermost_ends():
    out = _run("""
with memory.kept_heap():
    with memory.kept_heap():
        pass
    out["after_inner"] = kept_after_free()
out["after_outer"] = kept_after_free()
""")
    assert out["after_inner"] > 0.9  # the inner block's end did not restore the rules
    assert out["after_outer"] < 0.5
