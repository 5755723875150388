"""A 4-bit draft's products without torch's int4 kernel: `rows_kernel.c`'s `hfspec_int4_rows` reads the same packed
codes and scales (`LeanLinear`'s int4 storage, torch's CPU int4 layout) and multiplies them into fp32 rows.

Why: `aten._weight_int4pack_mm_for_cpu`, which ran every 4-bit draft, is bound by its arithmetic, not by memory,
on the 2-core VMs (SmolLM2-135M's matrices fit in their caches), and it works in blocks of 4 rows, so a tree level
of 8 nodes cost 3.3 one-node levels and 16 nodes 6.8 (`benchmarks/bench_level_rows.py`). This kernel turns each
column's codes into fp32 with a table permute and applies the scales once per group (y += s·Σ x·code +
(o − 8s)·Σ x): on the 2-core Intel Xeon without AMX a layer's matrices and the head took 0.63 ms for one row
against torch's 1.00, and 4.00 ms for 16 rows against 6.83 (`benchmarks/bench_level_rows.py --storages "int4
kernel,int4 torch"`, benchmarks/results/xeon-noamx-2c-2026-12-06-level-rows-int4.md). The draft's q changes only by float rounding (fp32 activations where torch rounds them to
bf16): a proposal, so the output law is untouched.

Used by the lean draft step's int4 matrices for 1..`MAX_ROWS` rows in eager calls (one-token steps and tree
levels of an uncompiled draft, catch-up feeds, short prompts); a compiled step (and tree level) keeps torch's
kernel, which inductor knows, and is checked against an eager step that runs torch's kernel too (`as_compiled`): torch's kernel rounds
the activations to bf16, so over SmolLM2's 30 layers the two kernels' logits differ by more than the check allows
a miscompile (0.27 at a logit of 1.37), and a compiled step checked against this kernel's eager step was refused:
every `-compiled` 4-bit draft of a real-sized model decoded eagerly until the check took `as_compiled`.
`$HFSPEC_INT4_KERNEL`: "auto" (the default) and "on" use it wherever it builds and checks (x86-64 Linux with
AVX-512 or AVX2, as the verify kernel; built into the same library, with a body per instruction set reading torch's
layout on that CPU: blocks of 64 rows with AVX-512, 32 with AVX2, which `hfspec_int4_block` reports and the build
compares with `packing.int4_block`), "off" keeps torch's kernel. Checked against a
dequantised product before first use; where it cannot be built or disagrees, torch's kernel runs and `status()`
says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import torch

from hfspec.kernels import verify_linear
from hfspec.quant import groupwise, packing

MODE_ENV = "HFSPEC_INT4_KERNEL"
FUNCTION = "hfspec_int4_rows"  # its name in the library
BLOCK_FUNCTION = "hfspec_int4_block"  # rows per block of the layout it reads: 64 (AVX-512 body) or 32 (AVX2)
# Rows a call may have to take this kernel: past them torch's kernel (and, from `DEQUANTISED_FROM`, a bf16 GEMM of
# dequantised blocks) was as fast (benchmarks/bench_level_rows.py on the no-AMX Xeon, 6 December 2026)
MAX_ROWS = 64
PATH = f"int4 CPU kernel (hfspec's for 1-{MAX_ROWS} rows, aten._weight_int4pack_mm_for_cpu compiled or past them)"

_lock = threading.Lock()
_built: tuple[object | None, str] | None = None
_as_compiled = threading.local()  # .on: this thread's eager calls take torch's kernel (`as_compiled`)


def mode() -> str:
    """`$HFSPEC_INT4_KERNEL` ("auto" when unset; the verify kernel's modes, another value refused by name)."""
    return verify_linear.mode(MODE_ENV)


def function():
    """The kernel's C function, built and checked on first use; None where it is off or cannot run (`status`)."""
    global _built
    if mode() == "off":
        return None
    with _lock:
        if _built is None:
            _built = _build()
        return _built[0]


def status() -> str:
    """What a 4-bit draft's matrices run here: this kernel or torch's, and why."""
    if mode() == "off":
        return f"torch's int4 kernel ({MODE_ENV}=off)"
    fn = function()
    return _built[1] if fn is not None else f"torch's int4 kernel ({_built[1]})"


@contextlib.contextmanager
def as_compiled():
    """Within it, this thread's eager int4 products take torch's kernel, as a compiled step's do: what a compiled
    step is checked against."""
    before = getattr(_as_compiled, "on", False)
    _as_compiled.on = True
    try:
        yield
    finally:
        _as_compiled.on = before


def held() -> bool:
    """Whether this thread is inside `as_compiled`."""
    return getattr(_as_compiled, "on", False)


def tracing() -> bool:
    """Whether this thread is being traced by torch.compile. `torch.compiler.is_compiling()` alone is a process-wide
    flag: while one thread compiled a draft step, another thread's eager int4 products read it as True and took
    torch's kernel, so that thread's native step disagreed with its eager step at its check (bf16 rounding of the
    activations) and was turned off, and its text differed from the same seed's run alone
    (tests/test_concurrency.py). The tracing context is per thread; `_traced_here` is read once at trace time."""
    return torch.compiler.is_compiling() and _traced_here()


@torch._dynamo.assume_constant_result
def _traced_here() -> bool:
    from torch._guards import TracingContext

    return TracingContext.try_get() is not None


def reset() -> None:
    """Forget the built kernel (tests, a changed folder)."""
    global _built
    with _lock:
        _built = None


def matmul(fn, x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, n: int, group: int,
           bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] fp32 times the int4 weight (`LeanLinear`'s `packed` [Np, K/2] and `scales_and_zeros` [K/group, Np, 2]
    bf16), first `n` outputs, plus `bias`: y [M, n] fp32."""
    x = x.contiguous()
    m, k = x.shape
    y = torch.empty(m, n, dtype=torch.float32)
    if fn(x.data_ptr(), packed.data_ptr(), scales_and_zeros.data_ptr(), bias.data_ptr() if bias is not None else None,
          y.data_ptr(), m, n, packed.shape[0], k, group, torch.get_num_threads()):
        raise RuntimeError(f"hfspec's int4 kernel refused x {tuple(x.shape)} against {n} × {k} (group {group})")
    return y


def reference(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, n: int, group: int,
              bias: torch.Tensor | None) -> torch.Tensor:
    """The same product through a dequantised fp32 weight (what the check compares with)."""
    codes = packing.unpack_int4_cpu(packed, x.shape[1])[:n]
    scale, offset = scales_and_zeros[:, :n, 0].float().t(), scales_and_zeros[:, :n, 1].float().t()  # [n, G]
    w = groupwise.group_dequantize(codes, scale, offset - 8 * scale, group)  # (code − 8) · s + o
    return torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float())


def _build() -> tuple[object | None, str]:
    loaded, where = verify_linear.load_library()
    if loaded is None:
        return None, where
    try:
        fn = getattr(loaded, FUNCTION)
        block = int(getattr(loaded, BLOCK_FUNCTION)())
    except AttributeError:
        return None, f"{where} has no {FUNCTION} or {BLOCK_FUNCTION}"
    if packing.int4_block() != block:
        return None, (f"torch's int4 layout here has blocks of {packing.int4_block()} rows, the kernel reads blocks of "
                      f"{block}")
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_int]
    fn.restype = ctypes.c_int
    wrong = _check(fn, block)
    if wrong:
        return None, f"hfspec's int4 kernel was built but disagrees with a dequantised product ({wrong})"
    isa = "AVX-512" if block == 64 else "AVX2"
    return fn, f"hfspec's int4 kernel ({isa}, 1-{MAX_ROWS} rows; {where})"


def _check(fn, block: int = 64) -> str:
    """'' when the kernel matches `reference` on every chunking of rows, ragged N, groups of 32 and 64, with and
    without a bias, for weights packed in blocks of `block` rows (the layout it reads); else what differed."""
    generator = torch.Generator().manual_seed(0)
    for n, k, group, bias in ((70, 64, 32, True), (128, 192, 64, False), (200, 96, 32, False)):
        padded = -(-n // 64) * 64
        codes = torch.randint(0, 16, (padded, k), generator=generator, dtype=torch.uint8)
        packed = packing.pack_int4_cpu(codes, block)
        sz = (torch.rand(k // group, padded, 2, generator=generator) - 0.5).to(torch.bfloat16)
        b = torch.randn(n, generator=generator) if bias else None
        for rows in (1, 2, 5, 6, 7, 13, 16):
            x = torch.randn(rows, k, generator=generator)
            got = matmul(fn, x, packed, sz, n, group, b)
            want = reference(x, packed, sz, n, group, b)
            scale = want.abs().max().item() + 1e-6
            if not (got - want).abs().max().item() <= 1e-5 * scale * k ** 0.5:
                return f"{rows} rows, {n} × {k}, group {group}: off by {(got - want).abs().max().item():.2e}"
    return ""
