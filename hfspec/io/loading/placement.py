"""Where and in what precision a model loads: dtype, device and device_map spellings, checked by name."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hfspec.errors import HfspecError

# Accepted dtype spellings -> torch dtype ("auto" -> the checkpoint's own dtype).
_DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "auto": "auto",
}
DTYPE_NAMES = ("float32", "bfloat16", "float16", "auto")
DEVICE_NAMES = ("cpu", "cuda", "cuda:N", "mps", "auto")
DEVICE_MAP_NAMES = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_dtype(dtype, *, role: str = "model") -> torch.dtype | str | None:
    """Map a dtype spelling (``"float32"``, ``"bf16"``, ``"auto"``, a ``torch.dtype``, or None) to what
    ``from_pretrained`` takes. Raises HfspecError naming ``<role>.dtype`` and the allowed values."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float32, torch.bfloat16, torch.float16):
            return dtype
        raise HfspecError(f"{role} dtype: got {dtype}; allowed: {', '.join(DTYPE_NAMES)}")
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
        if key in _DTYPES:
            return _DTYPES[key]
    raise HfspecError(f"{role} dtype: got {dtype!r}; allowed: {', '.join(DTYPE_NAMES)} (or a torch dtype)")


def _cuda_count() -> int:
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver reads as "no CUDA"
        return 0


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def parse_device(device, *, role: str = "model") -> str | None:
    """Validate a single-device spelling and return a canonical string ("cpu", "cuda:0", "mps"), or None.

    "auto" picks the best single device present (cuda:0, then mps, then cpu). A CUDA/MPS device that is not
    present is an HfspecError (not a failure deep inside the load)."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}"
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise HfspecError(f"{role} device: got {device!r}; allowed: {', '.join(DEVICE_NAMES)}")
    key = device.strip().lower()
    if key == "auto":
        if _cuda_count():
            return "cuda:0"
        if _mps_available():
            return "mps"
        return "cpu"
    if key == "cpu":
        return "cpu"
    if key in ("mps", "mps:0"):
        if not _mps_available():
            raise HfspecError(
                f"{role} device: 'mps' requested but Apple MPS is not available here; "
                f"allowed here: {', '.join(_present_devices())}"
            )
        return "mps"
    if key == "cuda" or key.startswith("cuda:"):
        index_text = key[5:] if key.startswith("cuda:") else "0"
        if not index_text.isdigit():
            raise HfspecError(f"{role} device: got {device!r}; allowed: {', '.join(DEVICE_NAMES)}")
        index = int(index_text)
        count = _cuda_count()
        if count == 0:
            why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise HfspecError(
                f"{role} device: {device!r} requested but CUDA is not available ({why}); "
                f"allowed here: {', '.join(_present_devices())}"
            )
        if index >= count:
            raise HfspecError(
                f"{role} device: {device!r} requested but only {count} CUDA device(s) exist; "
                f"allowed here: {', '.join(_present_devices())}"
            )
        return f"cuda:{index}"
    raise HfspecError(f"{role} device: got {device!r}; allowed: {', '.join(DEVICE_NAMES)}")


def _present_devices() -> list[str]:
    names = ["cpu", "auto"]
    names += [f"cuda:{i}" for i in range(_cuda_count())]
    if _mps_available():
        names.append("mps")
    return names


def _check_device_map(device_map, role: str):
    if device_map is None:
        return None
    if isinstance(device_map, str):
        key = device_map.strip().lower()
        if key in DEVICE_MAP_NAMES:
            return key
        # a single device spelled as a device_map ("cuda:0", "cpu") is fine too
        try:
            return parse_device(key, role=role)
        except HfspecError:
            raise HfspecError(
                f"{role} device_map: got {device_map!r}; allowed: {', '.join(DEVICE_MAP_NAMES)}, "
                "a single device, or a dict {module name: device | 'cpu' | 'disk'}"
            ) from None
    if isinstance(device_map, Mapping):
        for module, dev in device_map.items():
            if dev in ("cpu", "disk", "meta") or isinstance(dev, int):
                if isinstance(dev, int) and not isinstance(dev, bool):
                    parse_device(dev, role=f"{role} device_map[{module!r}]")
                continue
            parse_device(dev, role=f"{role} device_map[{module!r}]")
        return dict(device_map)
    raise HfspecError(
        f"{role} device_map: got {device_map!r}; allowed: {', '.join(DEVICE_MAP_NAMES)}, "
        "a single device, or a dict {module name: device | 'cpu' | 'disk'}"
    )




def all_on_cpu(dev, dmap) -> bool:
    if dmap is None:
        return dev in (None, "cpu")
    if isinstance(dmap, dict):
        return all(d in ("cpu", "disk", "meta") for d in dmap.values())
    return dmap == "cpu" or (dmap in DEVICE_MAP_NAMES and _cuda_count() == 0 and not _mps_available())


def _summarise_map(dmap: dict) -> str:
    counts: dict[str, int] = {}
    for d in dmap.values():
        counts[str(d)] = counts.get(str(d), 0) + 1
    return "{" + ", ".join(f"{d}: {n}" for d, n in counts.items()) + "}"



def check_placement(dtype, device, device_map, max_memory, offload_folder, role: str):
    """(torch dtype or None, device or None, device_map or None) after checking that they go together."""
    torch_dtype = parse_dtype(dtype, role=role)
    if device is not None and device_map is not None:
        raise HfspecError(
            f"{role}: got both device={device!r} and device_map={device_map!r}; allowed: one of them "
            "(device for a single device, device_map for sharding/offload)"
        )
    dev = parse_device(device, role=role)
    dmap = _check_device_map(device_map, role)
    if max_memory is not None:
        if not isinstance(max_memory, Mapping):
            raise HfspecError(
                f"{role} max_memory: got {max_memory!r}; allowed: a dict like {{0: '10GiB', 'cpu': '30GiB'}}"
            )
        if dev is not None:
            raise HfspecError(f"{role}: max_memory needs device_map (e.g. 'auto'), not device={device!r}")
        if dmap is None:
            dmap = "auto"
    if offload_folder is not None and dmap is None:
        raise HfspecError(
            f"{role} offload_folder: only used with device_map (e.g. 'auto' with max_memory, or a "
            "dict placing modules on 'disk')"
        )
    return torch_dtype, dev, dmap


def describe_placement(dev, dmap) -> str:
    """Where a load puts the model, for progress lines."""
    if dev is not None:
        return dev
    if dmap is None:
        return "cpu"
    return dmap if isinstance(dmap, str) else "device_map " + _summarise_map(dmap)
