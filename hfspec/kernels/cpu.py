"""Which kind of CPU this is, for the choices and priors that differ between kinds.

Three kinds were measured (2-core VMs, torch 2.13, SmolLM2-135M): "avx512" (AMD EPYC Zen 4: AVX-512 with bf16
dot products, no AMX), "avx2" (AMD EPYC Zen 2: no AVX-512, so no bf16 instructions at all) and "amx" (Intel Xeon
with AMX tiles and a 480 MB L3 that holds a 135M model whole). Where they differ, measured: on "avx2" a bf16 verify
position costs nearly half a step; on "amx" a bf16 one-token step is slower than fp32's (40 against 34 ms) while a
bf16 verify pass stays flat (1.18x at 16 positions), and oneDNN's prepacked fp32 one-row product is 1.3x MKL's
sgemv (on "avx512" it was 0.8x) (`hfspec.decoding.priors` holds the figures and their sources).

Detected from torch's dispatch capability and `torch.cpu._is_amx_tile_supported`; `HFSPEC_CPU_KIND` pins it (the
tests do, so that seeded choices do not depend on the machine that runs them).
"""

from __future__ import annotations

import functools
import os

import torch

from hfspec.errors import bad_value

# $HFSPEC_CPU_KIND value -> the priors' key for it
CPU_KINDS = {"avx512": "cpu", "avx2": "cpu-avx2", "amx": "cpu-amx"}
CPU_KIND_ENV = "HFSPEC_CPU_KIND"


@functools.cache
def detected_kind() -> str:
    """"avx2", "amx" or "avx512" (anything else: the AVX-512 rows are the default) for the CPU this runs on."""
    capability = torch.backends.cpu.get_cpu_capability().lower()
    if capability == "avx2":
        return "avx2"
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return "amx" if amx is not None and amx() else "avx512"
    except RuntimeError:
        return "avx512"


def cpu_kind() -> str:
    """The priors' key for this CPU: "cpu" (AVX-512 without AMX, or anything not listed), "cpu-avx2" or "cpu-amx"
    (`HFSPEC_CPU_KIND`: "avx512", "avx2" or "amx" pins it; another value is refused by name)."""
    pinned = os.environ.get(CPU_KIND_ENV, "")
    if pinned and pinned not in CPU_KINDS:
        raise bad_value(CPU_KIND_ENV, pinned, ", ".join(list(CPU_KINDS)[:-1]) + " or " + list(CPU_KINDS)[-1])
    return CPU_KINDS[pinned or detected_kind()]


@functools.cache
def cpu_name() -> str:
    """The CPU's model name as the OS gives it (/proc/cpuinfo's "model name" on Linux, else
    `platform.processor()`), "" where neither says: part of what a cost profile is keyed by
    (`hfspec.decoding.profile`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or ""
