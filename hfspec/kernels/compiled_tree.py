"""A compiled token-tree level for compiled lean drafts (`-compiled` specs): `LeanDecoder.level` (W nodes at explicit
positions, a tree mask over every preallocated cache slot) through `torch.compile`, one graph for every width from
2 to `LEVEL_MAX` (the width is a dynamic dimension; a one-node level is padded to two). Without it a tree level ran
the eager lean step (benchmarks/bench_tree.py --eager-levels measures the difference end to end).

It is compiled the first time a run grows a token tree with the draft (`CompiledStep.tree_level`; the dashboard and
`hfspec run` do it before a tree run starts, with progress), not when the draft is built: chain runs never pay for
it. Inductor keeps the artefact on disk beside the step's, so later processes load it in seconds. Like the step, it
is checked against the eager level; a failed compile is tried again without inductor's caches (a compile killed
midway may leave a truncated artefact), and where it still cannot compile, tree levels keep the eager lean step
(`path` says why; nothing else changes). On the no-AMX Xeon a compiled level of 1-4 nodes cost 1.2-1.8 one-token
steps against the eager level's 1.5-2.1; at 8 nodes both about 3 (benchmarks/bench_tree_level.py).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch

from hfspec.errors import first_line
from hfspec.kernels.compile_progress import Ticker, end_compile_workers
from hfspec.kernels.lean_cache import CACHE_CHUNK

LEVEL_MAX = 16  # widest level that runs compiled (`hfspec.decoding.tree_shape.WIDTH_MAX`); wider ones run eagerly
EXAMPLE_WIDTH = 3  # the width compiled with: ≥ 2 (dynamo specialises 0 and 1), unlike the cache's and tables' sizes


class CompiledLevel:
    """A compiled draft's tree level; `level(ids [1, W], positions [W], allowed [W, cache.length + W], cache)`.
    `path`: "not compiled yet", "compiled" or "eager (why)"."""

    def __init__(self, step):
        self.step = step  # the draft's `CompiledStep` (its settings, tables and check)
        self.fn = None
        self.path = "not compiled yet"
        self.seconds = 0.0

    def prepare(self, say: Callable[[str], None] | None = None) -> str:
        """Compile once (a no-op afterwards); returns `path`."""
        if self.path != "not compiled yet":
            return self.path
        say = _safe(say or self.step.say)
        began = time.perf_counter()
        say("compiling the draft's tree level (once; kept on disk for the next run)…")
        cache = self.step.scratch_cache(2 * EXAMPLE_WIDTH)
        args = _level_args(torch.zeros(1, EXAMPLE_WIDTH, dtype=torch.long), torch.arange(1, 1 + EXAMPLE_WIDTH), 1,
                           torch.ones(EXAMPLE_WIDTH, 1 + EXAMPLE_WIDTH, dtype=torch.bool), cache, self.step.tables)
        for tensor, dim in zip(args[:4], (1, 0, 0, 0), strict=True):
            torch._dynamo.mark_dynamic(tensor, dim)
        torch._dynamo.mark_dynamic(args[3], 1)  # the cache's capacity, as in the cache
        errors = []
        # as the step's settings (its cached artefacts); then bypassing inductor's caches, which a compile killed
        # midway may have left a truncated artefact in
        for patch in (self.step.patch, {**self.step.patch, "force_disable_caches": True}):
            try:
                with Ticker(say, began, what="the draft's tree level"):
                    self.fn = self.step._checked("level", args, patch)
                    self._warm_up()
                self.path = "compiled"
                break
            except Exception as error:  # noqa: BLE001 - tree levels keep the eager lean step, saying why
                self.fn = None
                errors.append(first_line(error))
        if self.fn is None:
            self.path = f"eager (compile failed: {errors[-1]})"
            warnings.warn(f"draft tree level: torch.compile failed ({'; '.join(errors)}); tree levels run the eager "
                          "lean step", RuntimeWarning, stacklevel=2)
        end_compile_workers()
        self.seconds = time.perf_counter() - began
        say(f"draft tree level: {self.path} ({self.seconds:.1f} s)")
        return self.path

    @torch.no_grad()
    def level(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache) -> torch.Tensor:
        """Logits [1, W, V] of W nodes ids [1, W] at rotary `positions` [W], written at the next W cache slots,
        node i seeing the slots row i of `allowed` [W, cache.length + W] marks."""
        start = cache.length
        count = ids.shape[1]
        tables = self.step.tables_for(int(positions.max()) + 1)
        logits = self.fn(*_level_args(ids, positions, start, allowed, cache, tables))
        cache.length = start + count
        return logits[:, :count]

    def _warm_up(self) -> None:
        """Widths 2 (a padded one-node level) to 8 across a cache growth, on scratch caches."""
        decoder = self.step.decoder
        for width, start in ((1, 1), (4, 3), (8, CACHE_CHUNK - 3)):
            cache = decoder.hfspec_new_cache()
            cache.reserve(1, start)
            cache.length = start
            self.level(torch.zeros(1, width, dtype=torch.long), torch.arange(start, start + width),
                       torch.ones(width, start + width, dtype=torch.bool), cache)


def prepare_tree_level(draft, progress: Callable[[str], None] | None = None) -> str | None:
    """Compile a draft's tree level now (a no-op where it is done or the draft has no compiled step), so that the
    first tree run does not compile it inside its timed rounds; its `path`, or None without a compiled step."""
    step = getattr(draft, "compiled_step", None)
    return step.tree_level.prepare(progress) if step is not None else None


def _level_args(ids: torch.Tensor, positions: torch.Tensor, start: int, allowed: torch.Tensor, cache,
                tables: list[torch.Tensor]) -> tuple:
    """`LeanDecoder.level`'s arguments for W nodes after `start` cached slots, padded to two nodes: a padding node
    sees only its own slot (past the real ones, beyond what the cache keeps)."""
    count = ids.shape[1]
    width = max(count, 2)
    end = start + width
    cache.reserve(1, end)
    seen = torch.zeros(width, cache.keys[0].shape[2], dtype=torch.bool)
    seen[:count, : start + count] = allowed
    pad_ids = torch.zeros(1, width, dtype=torch.long)
    pad_ids[:, :count] = ids
    pad_positions = torch.empty(width, dtype=torch.long)
    pad_positions[:count] = positions.view(-1)
    pad_positions[count:] = pad_positions[count - 1]
    for k in range(count, width):
        seen[k, start + k] = True
    return pad_ids, torch.arange(start, end), pad_positions, seen, tables, cache.keys, cache.values


def _safe(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say` that never raises (a progress callback from the draft's build may be gone by the first tree run)."""

    def call(message: str) -> None:
        try:
            say(message)
        except Exception:  # noqa: BLE001 - progress only
            pass

    return call
