"""`hfspec.io.memory.kept_heap`: freed memory stays in the process inside the block and goes back after it."""

import os

import pytest
import torch

from hfspec.io import memory

SIZE = 256 << 20  # well above glibc's mmap threshold (128 KiB, at most 32 MiB when it adapts)

pytestmark = pytest.mark.skipif(memory._glibc() is None or not os.path.exists("/proc/self/statm"),
                                reason="glibc and /proc only")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _grown_after_free(before: int) -> int:
    block = torch.ones(SIZE // 4)  # every page touched
    assert _rss() - before > 0.9 * SIZE
    del block
    return _rss() - before


def test_freed_memory_is_kept_inside_the_block_and_returned_after():
    # control: with glibc's rules a large block goes back to the OS as soon as it is freed
    assert _grown_after_free(_rss()) < 0.5 * SIZE
    with memory.kept_heap() as kept:
        assert kept
        before = _rss()
        assert _grown_after_free(before) > 0.9 * SIZE  # kept for the next allocation (whether the next one of
        # this size reuses it depends on what small allocations have landed in it since: not asserted)
    assert _rss() - before < 0.5 * SIZE  # returned on leaving
    assert _grown_after_free(_rss()) < 0.5 * SIZE  # and the old rules are back


def test_an_error_inside_still_restores_the_rules():
    with pytest.raises(RuntimeError), memory.kept_heap():
        raise RuntimeError("boom")
    assert _grown_after_free(_rss()) < 0.5 * SIZE


def test_nested_blocks_keep_until_the_outermost_ends():
    with memory.kept_heap():
        with memory.kept_heap():
            pass
        before = _rss()
        assert _grown_after_free(before) > 0.9 * SIZE  # the inner block's end did not restore the rules
    assert _grown_after_free(_rss()) < 0.5 * SIZE
