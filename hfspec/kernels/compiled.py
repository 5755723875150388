"""An optional compiled one-token step for lean drafts (`rtn4-compiled`): `torch.compile` (inductor) of
`LeanDecoder.one_token`, the lean step written with the same shapes at every step (the whole preallocated
cache, masked), for batch 1 without holes, and `LeanDecoder.tokens` over two tokens (`pair`): the catch-up feed after
a round that kept every proposal, in one call instead of two steps (a draft step is bound by the bytes of its
weights on the 2-core VMs, so a second row costs little; benchmarks/bench_pair.py). Other catch-up feeds of up to
`COMPILED_FEED_MAX` tokens run as one-token steps; prompts, longer feeds and batches keep the eager lean step; all
write the same cache.

Compiling takes seconds to minutes on a CPU, so it happens once when the draft is built, reported through
`progress`, and inductor's artefacts are kept on disk (`COMPILE_DIR`, unless TORCHINDUCTOR_CACHE_DIR is set):
a second process reuses them. A broken artefact (a compile killed midway can leave a truncated library) is
survived: our folder is emptied and the compile redone (in a folder the user chose, with inductor's caches
off instead), and when even that fails the draft keeps the eager lean step with a warning saying why; a compile
folder that cannot be used (a file of that name, no room, no write permission) gets the same warning.

The step is compiled with inductor's C++ wrapper (`cpp_wrapper`): the kernels are called from generated C++
instead of generated Python, which takes per-call overhead off a step of a few hundred small kernels (SmolLM2-135M
rtn4: 0.29 → 0.26 of a target step, `benchmarks/bench_wrapper.py`). The first compile takes
longer (about a third more). When the wrapper cannot be built even afresh, the step is compiled without it, and
a marker file in the compile folder (`NO_WRAPPER_MARKER`) makes later builds there skip the wrapper.

The artefacts do not depend on torch's thread count (`cpp.dynamic_threads`: the kernels read it when they run),
so the dashboard, which leaves a core to its window, and the CLI share them. Building the step also runs the
paths the decoding loop will take (one-token steps across a cache growth, catch-up feeds, the eager lean step
over prompt-sized feeds), so the first run after a fresh compile meets nothing new.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from hfspec.errors import first_line
from hfspec.kernels import int4_rows
from hfspec.kernels.compile_progress import Ticker, end_compile_workers
from hfspec.kernels.compiled_tree import CompiledLevel
from hfspec.kernels.lean_cache import CACHE_CHUNK

COMPILED_FEED_MAX = 4  # a compiled draft runs feeds of up to this many tokens as one-token steps (a round's catch-up)
PAIR = 2  # ... except a feed of this many, which runs as one compiled call (`CompiledStep.pair`)
COMPILE_DIR = Path(os.environ.get("HFSPEC_COMPILE_DIR", Path.home() / ".cache" / "hfspec" / "inductor"))
CPP_WRAPPER = True  # compile with inductor's C++ wrapper first (module docstring)
NO_WRAPPER_MARKER = "hfspec-no-cpp-wrapper"  # left in the compile folder when the wrapper could not be built


class CompiledStep:
    """`decoder.one_token` compiled; call it as `step(input_ids [1, 1], slot, cache)`.

    `path` says what runs: "compiled" or "eager (why)" after a failed compile."""

    def __init__(self, decoder, progress: Callable[[str], None] | None = None):
        self.decoder = decoder
        self.fn = None
        self.fn_pair = None  # `decoder.tokens` over PAIR tokens compiled, or None (`pair_path` says why)
        self.pair_path = "not compiled yet"
        self.wrapper = False  # whether the step runs through inductor's C++ wrapper
        self.seconds = 0.0
        self.path = "eager (not compiled yet)"
        self.say = progress or (lambda message: None)
        self.patch: dict = {}  # inductor settings the step compiled with (the tree level compiles with them too)
        self.tree_level = CompiledLevel(self)  # compiled on a run's first token tree (`hfspec.kernels.compiled_tree`)
        self._compile(self.say)

    def __call__(self, input_ids: torch.Tensor, slot: int, cache) -> torch.Tensor:
        """Logits [1, 1, V] of input_ids [1, 1] at cache slot `slot`, which is also its position."""
        cache.reserve(1, slot + 1)
        ids = torch.empty(1, 1, dtype=torch.long).copy_(input_ids)  # fixed strides: a slice of the slots would recompile
        logits = self.fn(ids, torch.tensor([slot]), self.tables_for(slot + 1), cache.keys, cache.values)
        cache.length = slot + 1
        return logits

    def pair(self, input_ids: torch.Tensor, slot: int, cache) -> torch.Tensor:
        """Logits [1, 1, V] of the last of input_ids [1, PAIR] written at cache slots `slot`, `slot + 1`, ... (their
        positions too) in one compiled call."""
        end = slot + PAIR
        cache.reserve(1, end)
        ids = torch.empty(1, PAIR, dtype=torch.long).copy_(input_ids)
        logits = self.fn_pair(ids, torch.arange(slot, end), self.tables_for(end), cache.keys, cache.values)
        cache.length = end
        return logits

    def tables_for(self, end: int) -> list[torch.Tensor]:
        """The rotary tables the compiled graphs read, doubled past `end` when a position reaches their end (their
        length is a dynamic dimension of every graph: `scratch_cache`)."""
        if end > self.tables[0].shape[0]:
            self.tables = self.decoder.rotary_tables(2 * end)
        return self.tables

    def scratch_cache(self, end: int):
        """A fresh cache of at least `end` slots to compile on: its capacity, like the rotary tables' length, is a
        dynamic dimension of the graph (one graph for every cache size and position)."""
        cache = self.decoder.hfspec_new_cache()
        cache.reserve(1, end)
        for tensor in cache.keys + cache.values:
            torch._dynamo.mark_dynamic(tensor, 2)
        for table in self.tables:
            torch._dynamo.mark_dynamic(table, 0)
        return cache

    def _compile(self, say: Callable[[str], None]) -> None:
        owned = _inductor_dir_unchosen()
        began = time.perf_counter()
        errors = []
        if owned:
            try:
                _usable_folder(COMPILE_DIR)
            except OSError as error:
                self._give_up([f"compile folder {COMPILE_DIR} unusable: {first_line(error)}"], say, began)
                return
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(COMPILE_DIR)
        where = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        # whether inductor compiles from scratch is known only once it looks in its cache: said then (Ticker)
        say(f"compiling the draft step (or reusing it from {where})…")
        misses = _cache_misses()
        scratch = f"compiling the draft step from scratch (the first time takes a while; kept in {where} for the next run)…"
        marker = Path(where) / NO_WRAPPER_MARKER
        wrapper = CPP_WRAPPER and not marker.exists()
        # (C++ wrapper, fresh) per attempt: as cached; afresh (a truncated artefact must not break the next run);
        # afresh without the wrapper (the plainer path, for a compiler that cannot build it)
        attempts = [(True, False), (True, True), (False, True)] if wrapper else [(False, False), (False, True)]
        for i, (with_wrapper, fresh) in enumerate(attempts):
            try:
                with Ticker(say, began, lambda fresh=fresh: fresh or _cache_misses() > misses, scratch) as ticker:
                    # a fresh try in our own (emptied) folder may cache again; in the user's, it bypasses the cache
                    self._compile_once(no_cache=fresh and not owned, wrapper=with_wrapper)
                if wrapper and not with_wrapper:  # remember, so later builds skip the failing wrapper attempts
                    _write_quietly(marker, f"inductor's C++ wrapper failed here: {errors[-1]}\n")
                break
            except Exception as error:  # noqa: BLE001 - any compiler failure falls back, saying why
                errors.append(first_line(error))
                torch._dynamo.reset()
                if i == len(attempts) - 1:
                    break
                if owned and i == 0:
                    shutil.rmtree(where, ignore_errors=True)  # a truncated artefact must not break the next run
                    Path(where).mkdir(parents=True, exist_ok=True)
                how = "without the C++ wrapper" if with_wrapper and not attempts[i + 1][0] else "without cached artefacts"
                say(f"compiling the draft step failed ({errors[-1]}); compiling afresh, {how}…")
        if self.fn is None:
            self._give_up(errors, say, began)
            return
        try:
            self._warm_up()
        except Exception as error:  # noqa: BLE001 - a step that fails on a real path must not be used
            self.fn = None
            self._give_up([f"warm-up failed: {first_line(error)}"], say, began)
            return
        end_compile_workers()
        self.seconds = time.perf_counter() - began
        self.path = "compiled"
        reused = "" if ticker.scratch or _cache_misses() > misses else f" (reused from {where})"
        say(f"compiled the draft step in {self.seconds:.1f} s{reused}")

    def _give_up(self, errors: list[str], say: Callable[[str], None], began: float) -> None:
        """The eager lean step, with a warning saying why (one wording for every way a compile can fail)."""
        self.seconds = time.perf_counter() - began
        self.path = f"eager (compile failed: {errors[-1]})"
        warnings.warn(f"draft step: torch.compile failed ({'; '.join(errors)}); using the eager lean step",
                      RuntimeWarning, stacklevel=4)
        say(f"draft step: compile failed, using the eager lean step ({errors[-1]})")

    @torch.no_grad()
    def _warm_up(self) -> None:
        """Run what decoding will run, once, on scratch caches: the compiled step at the first slots and across a
        cache growth (CACHE_CHUNK), through `decoder.logits` as catch-up feeds of up to COMPILED_FEED_MAX tokens;
        the eager lean step over longer (prompt) feeds."""
        decoder = self.decoder
        ids = torch.zeros(1, 1, dtype=torch.long)
        cache = decoder.hfspec_new_cache()
        for slot in (0, 1, 2, CACHE_CHUNK - 1, CACHE_CHUNK, CACHE_CHUNK + 1):
            self(ids, slot, cache)
        if self.fn_pair is not None:  # across a growth of the cache
            cache = decoder.hfspec_new_cache()
            for slot in (0, 2, CACHE_CHUNK - 1, CACHE_CHUNK + 1):
                self.pair(ids.expand(1, PAIR), slot, cache)
        for steps in (COMPILED_FEED_MAX + 9, COMPILED_FEED_MAX + 1, *range(COMPILED_FEED_MAX, 0, -1)):
            cache = decoder.hfspec_new_cache() if steps > COMPILED_FEED_MAX else cache
            decoder.logits(ids.expand(1, steps), None, None, cache, 1)

    def _compile_once(self, no_cache: bool, wrapper: bool) -> None:
        """Compile on a scratch cache and check the result against the eager one-token step."""
        self.tables = self.decoder.rotary_tables(1)  # grown (doubled) by `tables_for` when a position passes its end
        cache = self.scratch_cache(2)
        ids = torch.zeros(1, 1, dtype=torch.long)
        slot = torch.zeros(1, dtype=torch.long)
        # dynamic threads: the artefact is the same whatever torch's thread count (else part of its cache key)
        patch = {"force_disable_caches": no_cache, "cpp.dynamic_threads": True, "cpp_wrapper": wrapper}
        self.fn = self._checked("one_token", (ids, slot, self.tables, cache.keys, cache.values), patch)
        self.wrapper, self.patch = wrapper, patch
        self._compile_pair(cache, patch)

    def _compile_pair(self, cache, patch: dict) -> None:
        """`decoder.tokens` over PAIR tokens, compiled and checked as the one-token step is; where that fails, a
        pair feed runs as one-token steps (`pair_path` says why): the one-token step stands on its own."""
        args = (torch.zeros(1, PAIR, dtype=torch.long), torch.arange(1, 1 + PAIR), self.tables, cache.keys,
                cache.values)
        try:
            self.fn_pair, self.pair_path = self._checked("tokens", args, patch), "compiled"
        except Exception as error:  # noqa: BLE001 - the one-token step stands; pairs run as two of its steps
            why = first_line(error).replace("compiled step", "compiled pair step")
            self.fn_pair, self.pair_path = None, f"one-token steps ({why})"

    def _checked(self, name: str, args: tuple, patch: dict):
        """The decoder's method `name` compiled with the inductor settings `patch`, run once on `args` and checked
        against the same method run eagerly with the compiled step's kernels (`int4_rows.as_compiled`); raises
        where they differ."""
        from torch._inductor import config

        decoder = self.decoder
        # Dynamo's guards (one per closed-over weight) cost ~0.2 ms a call; every call here passes tensors of the
        # same dtypes and ranks (the cache length is dynamic), so guards are dropped. Without guards, drafts must
        # not share dynamo's cache, which lives on the code object: each decoder compiles its own copy of it.
        method = getattr(type(decoder), name)
        own = types.FunctionType(method.__code__.replace(), method.__globals__, method.__name__,
                                 method.__defaults__, method.__closure__)
        fn = torch.compile(types.MethodType(own, decoder), fullgraph=True, dynamic=False,
                           options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})
        with torch.no_grad(), config.patch(patch), _quiet_inductor():
            got = fn(*args)
            with int4_rows.as_compiled():  # the eager step with the compiled step's kernels
                want = method(decoder, *args)
        differs = step_difference(got, want)
        if differs:
            raise RuntimeError(differs)
        return fn


# The int4 and int8 CPU kernels return bf16 products, whose last bit depends on the order of the sums: on an AVX2
# CPU (AMD Zen 2, no AVX-512) the compiled step's head moved 3267 of SmolLM2's 49152 logits by one bf16 step
# (0.125 at 26.3; total variation of the two softmaxes 0.002, the same argmax), which an absolute 1e-3 had refused,
# so every calibrated draft decoded eagerly there. Two bf16 steps of the value are allowed (2⁻⁶ relative). A logit is
# a sum whose rounding scales with its terms, not its result, so a logit near 0 may move by a rounding of the row's
# scale: on an Intel AMX CPU the compiled fp32 int8 step's smallest logit came out 0.195 against 0.200 (the row's
# largest 30.5; softmaxes 0.006 apart in total variation, the same argmax), so int8-compiled decoded eagerly there.
# Hence also 2⁻⁸ of the row's largest magnitude. A miscompiled step differs far more. Exactness does not rest on
# this: a token's q comes from the step that drew it.
STEP_RTOL = 2 ** -6
STEP_ATOL = 1e-3
STEP_SCALE_ATOL = 2 ** -8


def step_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    """"" when the compiled step's logits agree with the eager step's within bf16 rounding (`STEP_RTOL` of each
    value, `STEP_SCALE_ATOL` of the largest), else what differs."""
    if got.shape != want.shape:
        return f"compiled step gives shape {tuple(got.shape)}, the eager step {tuple(want.shape)}"
    atol = max(STEP_ATOL, STEP_SCALE_ATOL * float(want.abs().max())) if want.numel() else STEP_ATOL
    if torch.allclose(got, want, atol=atol, rtol=STEP_RTOL):
        return ""
    allowed = atol + STEP_RTOL * want.abs()
    worst = int(((got - want).abs() - allowed).flatten().argmax())
    g, w, a = float(got.flatten()[worst]), float(want.flatten()[worst]), float(allowed.flatten()[worst])
    return f"compiled step differs from the eager step: logit {worst} is {g:.4g}, eager {w:.4g} (±{a:.2g} allowed)"


def _write_quietly(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:  # a read-only or full folder: the next build just tries the wrapper again
        pass


class _quiet_inductor:
    """Inductor's C++ wrapper logs a warning per operator it calls through its generic fallback (e.g. "aten.unsqueeze
    is missing a c-shim implementation"): a fact about inductor's coverage, not something a user can act on."""

    def __enter__(self):
        self.logger = logging.getLogger("torch._inductor.ir")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False


def _cache_misses() -> int:
    """Inductor's compiled-graph cache misses so far in this process (each one a compile from scratch)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_miss"])


def _usable_folder(folder: Path) -> None:
    """Create `folder` and check a file can be written in it; OSError otherwise (e.g. a file of that name)."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".hfspec-probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()



def _inductor_dir_unchosen() -> bool:
    """True unless the user chose inductor's cache folder (torch writes its /tmp default into the environment)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir())
