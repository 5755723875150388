"""A verify pass for less than the price of a one-token step, with no second copy of the weights: a target's fp32
and bf16 linears over the few rows of a verify pass run a small AVX-512 (or AVX2) kernel (`rows_kernel.c`) that reads
each weight row once for all the rows.

Why: torch's fp32 `F.linear` runs MKL, sgemv for one row and sgemm for more, and on the 2-core Intel AMX Xeon VM
sgemm over 4-16 rows costs 1.7-2.3x the one-row product at SmolLM2-135M's shapes (it repacks the weight at every
call), which made a chain's verify pass of 5 positions cost 1.6 one-token steps and decided fp32's speed-up
(`hfspec.kernels.fast_linear` avoids the repacking with a oneDNN copy of every weight, twice the memory, and gains
little there). bf16's oneDNN product is flat over rows but reads its weights at about half the speed the memory
allows. This kernel multiplies each slice of a weight row into one accumulator per input row (bf16 through the
CPU's bf16 dot products, accumulated in fp32 and rounded once, as oneDNN does) and prefetches two weight rows
ahead, so memory reads and arithmetic overlap. A whole SmolLM2-135M pass over 5 positions then costs 1.22 of an
fp32 one-token step instead of 1.56, and 0.78 of a bf16 one (oneDNN's) instead of 1.08 on the AMX Xeon; on the
AVX-512 EPYC (Zen 4), where MKL is slow, 0.64 of an fp32 step instead of 1.34 and 0.78 of a bf16 one instead of
1.14 (`benchmarks/bench_verify_width.py --dtypes float32+rows,bfloat16+rows`); on the AVX2 EPYC (Zen 2, no AVX-512,
no bf16 instructions; the C's AVX2 body) 0.86 of an fp32 step instead of 1.70 and 1.33 of a bf16 one instead of 2.77. On that EPYC the kernel also halves
a one-row fp32 product (a whole step 27.5 ms against MKL's 55.6), so part of a speculative decode's speed-up there
is the kernel's, not speculation's: `benchmarks/bench_results.py` times plain decoding through it as well. What the target computes changes only
by float rounding (another summation order), as with any BLAS; one-row calls, prefill and fp16 keep `F.linear`.

It is compiled once per machine with the C compiler on PATH (`cc`, or `$CC`) into `~/.cache/hfspec/kernels` (or
`$HFSPEC_KERNEL_DIR`) under a key of its source, the compiler, the flags and the CPU, written to a temporary file
and renamed into place (a build killed midway or out of disk leaves nothing to load), checked against `F.linear`
before first use, and rebuilt once if the library will not load. Where it cannot be built or checked (no
compiler, neither AVX-512 nor AVX2, an unusable folder) the verify pass keeps `F.linear`, a warning says why once per process,
and so does `status()`.

`$HFSPEC_ROWS_KERNEL`: "auto" (the default) uses it on the CPU kinds where it was measured faster (`ON_BY_KIND`:
the AMX Xeon, the AVX-512 EPYC and the AVX2 EPYC, where MKL is slow enough that even a 2-row pass costs 0.56 of its one-row step),
"on" wherever it builds, "off" nowhere. The decoding loop routes a target's linears through it for the length of a
speculative decode (`installed`) and restores them after; plain decoding is left as it is.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import platform
import shutil
import subprocess
import threading
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hfspec.attrs import BITWISE_VERIFY, get_attr
from hfspec.errors import bad_value, first_line
from hfspec.kernels.cpu import cpu_kind

SOURCE = Path(__file__).with_name("rows_kernel.c")
# built into one library with it: the native draft step (`hfspec.kernels.native_step`), which calls its int4 kernel
SOURCES = (SOURCE, Path(__file__).with_name("lean_step.c"))
KERNEL_DIR_ENV = "HFSPEC_KERNEL_DIR"
MODE_ENV = "HFSPEC_ROWS_KERNEL"
MODES = ("auto", "on", "off")
MIN_ROWS = 2  # one-row calls keep F.linear (MKL's sgemv, oneDNN)
# per dtype, the C function and the most rows a call may have to take it: past them F.linear was as fast or faster
# (SmolLM2-135M on the AMX Xeon, benchmarks/results/xeon-2c-2026-12-05-verify-width-rows-uncapped.md: a whole
# pass over 32 positions 2.37 steps against sgemm's 2.44; in bf16 16 positions 1.14 against oneDNN's 1.15, 24
# 1.50 against 1.24)
DTYPES = {torch.float32: ("hfspec_rows_f32", 32), torch.bfloat16: ("hfspec_rows_bf16", 16)}
MAX_ROWS = max(most for _, most in DTYPES.values())
# CPU kinds (`hfspec.kernels.cpu`) where "auto" uses it: where a verify pass was measured cheaper with it: the AMX
# Xeon (5 December 2026, benchmarks/results/xeon-2c-2026-12-05-verify-width-rows.md) and the AVX-512 EPYC (Zen 4,
# 5 December 2026, benchmarks/results/epyc-2c-2026-12-05-verify-width-rows.md: MKL's sgemm and sgemv are slow on
# that AMD CPU, and a whole fp32 pass over 5 positions cost 0.64 of an sgemv one-token step through the kernel
# against 1.34 without it; bf16 0.78 against 1.14). On "cpu" a machine that is not x86-64 with AVX-512 (an ARM
# machine takes the "cpu" rows too) is left to F.linear quietly in "auto" (`applies`). The AVX2 EPYC (Zen 2) runs
# the C's AVX2 body (8-float vectors): a whole fp32 pass over 5 positions cost 0.86 of MKL's one-token step against
# 1.70 without it, bf16 1.33 against 2.77 (7 December 2026, benchmarks/results/epyc-avx2-2c-2026-12-07-verify-width.md).
ON_BY_KIND = frozenset({"cpu", "cpu-amx", "cpu-avx2"})
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
BUILD_TIMEOUT = 120  # seconds

_lock = threading.Lock()
_library_lock = threading.Lock()
_built: tuple[dict | None, str] | None = None  # ({dtype: (C function, most rows)} or None, what runs and why)
_warned = False  # a kernel that was wanted and could not be built is said once per process


def kernel_dir() -> Path:
    return Path(os.environ.get(KERNEL_DIR_ENV) or Path.home() / ".cache" / "hfspec" / "kernels")


def mode(env: str = MODE_ENV) -> str:
    """`$HFSPEC_ROWS_KERNEL` (or another kernel's variable, `env`): "auto" when unset; another value is refused by
    name."""
    value = os.environ.get(env, "") or "auto"
    if value not in MODES:
        raise bad_value(env, value, "auto, on or off")
    return value


def wanted() -> bool:
    """Whether this machine's verify passes should use the kernel (`mode`, the CPU kind and `applies`; built or
    not): "on" wants it anywhere (and warns where it cannot be built), "auto" only where it was measured faster."""
    chosen = mode()
    return chosen == "on" or (chosen == "auto" and cpu_kind() in ON_BY_KIND and not applies())


def running() -> bool:
    """Whether verify passes here take the kernel: wanted (`wanted`) and built (`kernel`)."""
    return wanted() and kernel() is not None


def applies() -> str:
    """'' where the kernel can run on this machine (x86-64 Linux, a torch that dispatches AVX-512 or AVX2; the C
    has a body for each), else why not."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the few-row kernel is built for x86-64 Linux only, not {platform.system()} {platform.machine()}"
    capability = torch.backends.cpu.get_cpu_capability().lower()
    if "avx512" not in capability and "avx2" not in capability:
        return f"the few-row kernel needs AVX-512 or AVX2 (this CPU: {capability})"
    return ""


def kernel() -> dict | None:
    """{dtype: (the kernel's C function, the most rows it takes)}, built or loaded on first use; None where it
    cannot be (`status` says why)."""
    global _built
    with _lock:
        if _built is None:
            _built = _build()
        return _built[0]


def status() -> str:
    """What a verify pass's fp32 and bf16 linears run here: the kernel and where it lives, or F.linear and why."""
    if not wanted():
        return f"F.linear (the few-row kernel is off: {MODE_ENV}={mode()}, CPU kind {cpu_kind()})"
    fn = kernel()
    return _built[1] if fn is not None else f"F.linear ({_built[1]})"


def reset() -> None:
    """Forget the built kernel, so that the next use builds or loads it again (tests, a changed folder)."""
    global _built, _warned, _loaded
    with _lock, _library_lock:
        _built, _warned, _loaded = None, False, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           min_rows: int = MIN_ROWS) -> torch.Tensor:
    """F.linear(x, weight, bias) for fp32 or bf16 CPU tensors through the kernel when x has min_rows..the dtype's
    most rows, the kernel is built and nothing needs a gradient; F.linear otherwise."""
    rows = x.numel() // weight.shape[1] if x.dim() and weight.dim() == 2 else 0
    fns = _built[0] if _built is not None else None
    dtype = weight.dtype
    if (fns is None or dtype not in fns or not min_rows <= rows <= fns[dtype][1] or x.dtype != dtype
            or x.device.type != "cpu" or weight.device.type != "cpu" or not weight.is_contiguous()
            or (bias is not None and (bias.dtype != dtype or not bias.is_contiguous()))
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    x2 = x.reshape(rows, k).contiguous()
    y = torch.empty(rows, n, dtype=dtype)
    fns[dtype][0](x2.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None, y.data_ptr(),
                  rows, n, k, torch.get_num_threads())
    return y.view(*x.shape[:-1], n)


def _forward(self: nn.Linear, x: torch.Tensor, min_rows: int = MIN_ROWS) -> torch.Tensor:
    return linear(x, self.weight, self.bias, min_rows)


def routable(module: nn.Module) -> bool:
    """A plain fp32 or bf16 CPU `nn.Linear` whose forward nobody has replaced (not prepacked, no accelerate hook)."""
    return (type(module) is nn.Linear and "forward" not in module.__dict__ and module.weight.dtype in DTYPES
            and module.weight.device.type == "cpu")


def plain(module: nn.Module) -> bool:
    """`routable`, or routed by `installed` right now: the module's own weight is all its forward reads."""
    forward = module.__dict__.get("forward")
    func = forward.__func__ if isinstance(forward, types.MethodType) else None
    ours = func is _forward or (isinstance(func, functools.partial) and func.func is _forward)
    return routable(module) or (ours and type(module) is nn.Linear and module.weight.device.type == "cpu")


def describe_for(model: nn.Module) -> str:
    """What the model's verify passes will run, for a progress line ("verify passes: few-row kernel (...)" or
    "verify passes: F.linear (why)"); "" where the kernel is not wanted or the model has no linear it takes."""
    if not wanted() or not any(routable(m) for m in model.modules()):
        return ""
    return f"verify passes: {status()}"


def active_for(model: nn.Module) -> bool:
    """Whether `installed(model)` would route any of the model's linears through a built kernel."""
    return not get_attr(model, BITWISE_VERIFY) and any(routable(m) for m in model.modules()) and running()


@contextmanager
def installed(model: nn.Module, one_row: bool = False) -> Iterator[int]:
    """Route `model`'s plain fp32 and bf16 CPU linears through `linear` inside the block (where `wanted` and built;
    yields how many), restoring each forward after. Modules another path already owns are left alone, so blocks nest;
    a model whose verify passes must round as `generate` does (`BITWISE_VERIFY`) is left alone whole. `one_row`:
    one-row calls too (what the benchmarks time plain decoding through, to tell the kernel's share of a speed-up
    from speculation's; a speculative decode keeps one-row calls on F.linear)."""
    if get_attr(model, BITWISE_VERIFY):  # generate's one-token rounding, bit for bit: F.linear's own path
        yield 0
        return
    if not wanted() or kernel() is None:
        if wanted():
            _warn_once(f"hfspec: verify passes keep F.linear: {_built[1]}")
        yield 0
        return
    modules = [module for module in model.modules() if routable(module)]
    for module in modules:
        module.__dict__["forward"] = types.MethodType(functools.partial(_forward, min_rows=1) if one_row else _forward,
                                                     module)
    try:
        yield len(modules)
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _build() -> tuple[dict | None, str]:
    """Compile (or find compiled) and load the kernel, then check it against F.linear: (function, description) or
    (None, why not)."""
    loaded, library = load_library()
    if loaded is None:
        return None, library
    fns = {}
    for dtype, (name, most) in DTYPES.items():
        fn = getattr(loaded, name)
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = ctypes.c_int
        fns[dtype] = (fn, most)
    wrong = _check(fns)
    if wrong:
        return None, f"the few-row kernel was built but disagrees with F.linear ({wrong})"
    return fns, (f"few-row kernel (AVX-512; fp32 {MIN_ROWS}-{DTYPES[torch.float32][1]} rows, bf16 "
                 f"{MIN_ROWS}-{DTYPES[torch.bfloat16][1]}; {library})")


_loaded: tuple[ctypes.CDLL | None, str] | None = None


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """The compiled `rows_kernel.c` (built or found in `kernel_dir`, once per process) and its path, or (None, why
    not): shared by the verify kernel and the draft's int4 kernel (`hfspec.kernels.int4_rows`)."""
    global _loaded
    with _library_lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def _load() -> tuple[ctypes.CDLL | None, str]:
    why_not = applies()
    if why_not:
        return None, why_not
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc or $CC) on PATH to build the few-row kernel"
    flags = _flags()
    try:
        library = _library(compiler, flags)
        try:
            loaded = ctypes.CDLL(str(library))
        except OSError:  # a damaged file: build it again, once
            library.unlink(missing_ok=True)
            library = _library(compiler, flags)
            loaded = ctypes.CDLL(str(library))
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"the few-row kernel could not be built: {first_line(error)}"
    return loaded, str(library)


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def _flags() -> list[str]:
    return list(FLAGS) + _openmp_link()


def _library(compiler: str, flags: list[str]) -> Path:
    """The compiled library's path, compiling it first if it is not in the folder (temporary file, then rename)."""
    source = b"\0".join(path.read_bytes() for path in SOURCES)
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode(), _cpu_id().encode()]))
    folder = kernel_dir()
    library = folder / f"rows-{key.hexdigest()[:20]}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{library.name}.{os.getpid()}.tmp"
    try:
        done = subprocess.run([compiler, *map(str, SOURCES), "-o", str(partial), *flags], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT)
        if done.returncode != 0:
            raise OSError(f"{Path(compiler).name} failed: {(done.stderr or done.stdout).strip()[:300]}")
        os.replace(partial, library)
    finally:
        partial.unlink(missing_ok=True)
    return library


def _openmp_link() -> list[str]:
    """Link against torch's own OpenMP runtime where it ships one, so that both share one thread pool."""
    found = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*")))
    if not found:
        return []
    return [f"-L{os.path.dirname(found[0])}", f"-l:{os.path.basename(found[0])}",
            f"-Wl,-rpath,{os.path.dirname(found[0])}"]


def _cpu_id() -> str:
    """What `-march=native` compiles for: the CPU's model name and flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def _check(fns: dict) -> str:
    """'' when the kernel computes F.linear on every row count, ragged K and with and without a bias (bf16: to
    within one bf16 rounding of the fp32 product), else what differed."""
    generator = torch.Generator().manual_seed(0)
    for dtype, (fn, _) in fns.items():
        for k, n, bias in ((37, 70, True), (64, 129, False), (576, 96, True)):
            w = torch.randn(n, k, generator=generator).to(dtype)
            b = torch.randn(n, generator=generator).to(dtype) if bias else None
            for rows in range(1, MAX_ROWS + 1):
                x = torch.randn(rows, k, generator=generator).to(dtype)
                y = torch.empty(rows, n, dtype=dtype)
                if fn(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else None, y.data_ptr(), rows, n, k,
                      2):
                    return f"refused {rows} rows"
                want = F.linear(x.float(), w.float(), b.float() if b is not None else None)
                tolerance = 1e-4 if dtype == torch.float32 else 2 ** -7  # bf16: one rounding of the output
                if not torch.allclose(y.float(), want, rtol=tolerance, atol=tolerance * 4):
                    return f"{dtype}, {rows} rows, K {k}: off by {(y.float() - want).abs().max().item():.2e}"
    return ""

