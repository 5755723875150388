"""Will a model fit in this machine's memory? Estimated from the checkpoint before anything is allocated.

A model too big for RAM is otherwise found out by the kernel's OOM killer, which ends the process (and the
dashboard with it) without a word. `check_fits` reads the tensor shapes from the safetensors headers (a few
KiB, no weights read) or the weight files' sizes, prices them in the dtype the model will be loaded in, and
compares with what the OS reports as available (MemAvailable in /proc/meminfo; no psutil). Where either number
is unknown (a hub id not downloaded, a system without /proc) it says nothing rather than guess.

HFSPEC_AVAILABLE_MEMORY (bytes, or a size such as "2GiB", "500MB") replaces the OS figure: for tests, and for
users who want a lower ceiling than the machine's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import threading
from pathlib import Path

import torch

from hfspec.dtypes import dtype_str
from hfspec.errors import HfspecError

ENV = "HFSPEC_AVAILABLE_MEMORY"
# a loaded model needs more than its weights: buffers, the Python objects, the KV cache and activations of a
# first forward; this fraction of the weights plus a fixed amount is added to the estimate
OVERHEAD_FRACTION = 0.10
OVERHEAD_BYTES = 256 << 20
DRAFT_SCRATCH_BYTES = 64 << 20  # building a draft quantises a block of rows at a time

_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_DTYPE_OF_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                  "float64": torch.float64}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """"2GiB", "500MB", "123456" -> bytes; HfspecError naming HFSPEC_AVAILABLE_MEMORY otherwise."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise HfspecError(f"{ENV}: got {text!r}; allowed: a byte count or a size such as 2GiB, 500MB")
    return int(float(match.group(1)) * _UNITS[unit])


def available_bytes() -> int | None:
    """Memory a new allocation can take now: HFSPEC_AVAILABLE_MEMORY, else MemAvailable; None when unknown."""
    if os.environ.get(ENV):
        return parse_size(os.environ[ENV])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def checkpoint_dtype(folder) -> torch.dtype | None:
    """The dtype a checkpoint folder's config.json says it was saved in (None when it does not say)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for where in (config, config.get("text_config") or {}):
        name = where.get("dtype") or where.get("torch_dtype")
        if isinstance(name, str) and name in _DTYPE_OF_NAME:
            return _DTYPE_OF_NAME[name]
    return None


def _safetensors_elements(path: Path) -> list[tuple[int, int]]:
    """(elements, bytes per element) of every tensor in a safetensors file, from its header only."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    out = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        elements = 1
        for dim in entry["shape"]:
            elements *= int(dim)
        out.append((elements, _SAFETENSORS_BYTES.get(entry["dtype"], 4)))
    return out


def weight_bytes_on_load(folder, dtype) -> int | None:
    """Bytes the weights of a checkpoint folder take once loaded in `dtype` (a torch dtype, or "auto" / None
    for the saved dtype); None when the folder has no weight files hfspec can size."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    per_element = torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else None
    files = sorted(folder.glob("*.safetensors"))
    if files:
        total = 0
        for path in files:
            try:
                total += sum(n * (per_element or saved) for n, saved in _safetensors_elements(path))
            except (OSError, ValueError, KeyError, struct.error):
                total += path.stat().st_size  # an unreadable header: its size is the best guess
        return total
    files = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
    if not files:
        return None
    saved = checkpoint_dtype(folder) or torch.float32
    scale = per_element / torch.empty((), dtype=saved).element_size() if per_element else 1.0
    return int(sum(p.stat().st_size for p in files) * scale)


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_fits(folder, dtype, role: str = "model", available: int | None = None) -> int | None:
    """Raise HfspecError when loading the checkpoint in `folder` in `dtype` would need more memory than is
    available; return the estimate in bytes (None when it cannot be made). Called before anything is loaded."""
    weights = weight_bytes_on_load(folder, dtype)
    if weights is None:
        return None
    need = int(weights * (1 + OVERHEAD_FRACTION)) + OVERHEAD_BYTES
    free = available if available is not None else available_bytes()
    if free is not None and need > free:
        how = "HFSPEC_AVAILABLE_MEMORY" if available is None and os.environ.get(ENV) else "MemAvailable"
        half = "" if dtype in (torch.bfloat16, torch.float16) else (
            " dtype bfloat16 (half the bytes of float32),")
        raise HfspecError(
            f"{role}: {folder} needs about {gib(need)} of memory in {_name(dtype, folder)} (weights "
            f"{gib(weights)} plus working memory) but only {gib(free)} is available ({how}); nothing was loaded; "
            f"allowed: a smaller model,{half} or a device_map with max_memory / offload_folder")
    return need


def dtype_name(folder, dtype) -> str:
    """How a load's dtype reads in messages: "bfloat16"; for "auto", the saved dtype when config.json names it."""
    if isinstance(dtype, torch.dtype):
        return dtype_str(dtype)
    saved = checkpoint_dtype(folder)
    return dtype_str(saved) if saved else str(dtype)


def _name(dtype, folder) -> str:
    name = dtype_name(folder, dtype)
    return name if isinstance(dtype, torch.dtype) or name == str(dtype) else f"its saved dtype ({name})"


def check_draft_fits(target, bits: int, group_size: int, available: int | None = None) -> int:
    """Raise HfspecError when an RTN draft of `target` would not fit in the available memory (checked before
    building it); return the estimate in bytes. A lean draft stores 2-4-bit codes as the int4 kernel's 4 bits
    and 5-8-bit ones dequantised to bf16, plus a bf16 scale and zero per group; building adds a block of scratch."""
    seen, weights = set(), 0
    for p in target.parameters():
        if p.dim() >= 2 and p.device.type == "cpu" and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            weights += p.numel()
    per_weight = (0.5 if bits <= 4 else 2.0) + 4 / group_size
    need = int(weights * per_weight) + DRAFT_SCRATCH_BYTES
    free = available if available is not None else available_bytes()
    if free is not None and need > free:
        raise HfspecError(
            f"draft: an rtn{bits} draft of this target needs about {gib(need)} of memory but only {gib(free)} is "
            f"available; nothing was built; allowed: a 2-4-bit draft (4 bits a weight instead of 16 at 5-8 bits), a "
            f"prompt-lookup draft (no weights), or more free memory")
    return need


# glibc's mallopt parameters (malloc.h) and their defaults
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_KEEP_TRIM_THRESHOLD = 2**31 - 1
_kept_lock = threading.Lock()
_kept_depth = 0


def _glibc():
    """The C library through ctypes where it is glibc (it has mallopt and malloc_trim), else None."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        if not all(hasattr(libc, name) for name in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
            return None
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def kept_heap():
    """Memory freed inside the block stays in the process for the next allocation instead of going back to the
    OS (glibc: no mmap for large blocks, no trimming of the heap's top); on leaving, the old rules come back and
    what is free is returned (`malloc_trim`). Yields whether it could (False off glibc: nothing changes).

    For work that allocates and frees large temporaries many times, such as a calibration's per-matrix Hessians,
    factors and refit buffers: each fresh block is new pages the kernel must fault in, and where memory is
    nearly full it must first reclaim others. At the 1.7B shape's layer (a 2-core EPYC VM with 23 GB, 3 December
    2026) with 13 GB of the memory held elsewhere, a layer took 28-29 s with glibc's defaults and 23.6-24.5 s
    with freed memory kept, as with nothing held (21-23 s)."""
    libc = _glibc()
    if libc is None:
        yield False
        return
    global _kept_depth
    with _kept_lock:  # nested or concurrent blocks (two drafts calibrating in threads): the first sets, the last restores
        if _kept_depth == 0:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_TRIM_THRESHOLD)
        _kept_depth += 1
    try:
        yield True
    finally:
        with _kept_lock:
            _kept_depth -= 1
            if _kept_depth == 0:
                libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
                libc.malloc_trim(0)
