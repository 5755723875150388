"""Load a target or draft model (and its tokenizer) the way its users keep it.

``source`` may be

* a local Hugging Face folder (``config.json`` + weights) — loaded with ``local_files_only=True``, so no
  network call is ever made for it;
* a ``.gguf`` file (``folder/file.gguf``, or ``source=folder`` with ``gguf_file="file.gguf"``) — loaded by
  transformers' GGUF reader, which dequantises the weights to ``dtype`` (needs the optional ``gguf`` package:
  ``pip install 'hfspec[gguf]'``);
* a hub id (``"HuggingFaceTB/SmolLM2-135M-Instruct"``) — taken from the local hub cache, downloaded when
  online; with ``HF_HUB_OFFLINE=1`` or no network an uncached id is a clear :class:`HfspecError`.

A loaded model must be exactly its checkpoint: a config.json that does not match the weights (missing, extra
or mis-shaped tensors) and a truncated or empty ``.safetensors`` file are refused by name. Loads are serialised
process-wide (transformers' loading is not thread-safe) and each is checked for tensors left on the meta
device and for tied weights that are not tied (:func:`check_loaded`).

Every user mistake (missing path, folder without ``config.json``, uncached hub id, missing ``gguf`` package,
unknown dtype or device, unavailable CUDA device) raises :class:`hfspec.errors.HfspecError` naming the field
(``role``: ``"target"``, ``"draft"``, ...) and what is allowed; errors from inside transformers for these
mistakes are re-raised as ``HfspecError`` with the original exception chained as ``__cause__``.

Placement: ``device`` puts the whole model on one device ("cpu", "cuda", "cuda:N", "mps", or "auto" = the
best single device available). ``device_map`` (``"auto"``/``"balanced"``/``"sequential"``/... or an explicit
``{module: device}`` dict, ``"disk"`` allowed together with ``offload_folder``) and ``max_memory`` are passed
to accelerate for sharded or offloaded targets; such a model still decodes exactly (hooks move the weights).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hfspec.errors import HfspecError

__all__ = [
    "DTYPE_NAMES",
    "DEVICE_NAMES",
    "DEVICE_MAP_NAMES",
    "ResolvedSource",
    "check_loaded",
    "load_model",
    "load_tokenizer",
    "parse_device",
    "parse_dtype",
    "resolve_source",
]

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
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
)

Progress = bool | Callable[[str], Any] | None


# --------------------------------------------------------------------------------------------------------------
# validation


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


# --------------------------------------------------------------------------------------------------------------
# source resolution


@dataclass(frozen=True)
class ResolvedSource:
    """Where a model comes from. ``kind`` is "folder", "gguf" or "hub"; ``path`` is the folder (for "folder"
    and a local "gguf") or the hub id; ``gguf_file`` is the file name inside it (or None)."""

    kind: str
    path: str
    gguf_file: str | None = None
    note: str | None = None  # how an unusual source was interpreted (shown through progress)

    @property
    def local(self) -> bool:
        return self.kind in ("folder", "gguf") and os.path.isdir(self.path)

    def describe(self) -> str:
        if self.gguf_file:
            return os.path.join(self.path, self.gguf_file) if self.local else f"{self.path}/{self.gguf_file}"
        return self.path


def _looks_like_path(text: str) -> bool:
    if os.path.isabs(text) or text.startswith(("./", "../", "~", ".\\", "..\\")) or text in (".", ".."):
        return True
    if "\\" in text or text.count("/") > 1:
        return True
    return text.lower().endswith((".gguf", ".safetensors", ".bin", ".json", ".pt", ".pth"))


def _is_repo_id(text: str) -> bool:
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(text)
    except Exception:
        return False
    return True


def resolve_source(source, *, gguf_file=None, role: str = "model") -> ResolvedSource:
    """Decide whether ``source`` is a local folder, a GGUF file or a hub id (no loading, no network)."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source.strip():
        raise HfspecError(
            f"{role}: got {source!r}; allowed: a local folder, a .gguf file, or a hub id "
            "like 'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    source = source.strip()
    expanded = os.path.expanduser(source)
    if gguf_file is not None:
        gguf_file = os.fspath(gguf_file)
        if os.path.isdir(expanded):
            full = os.path.join(expanded, gguf_file)
            if not os.path.isfile(full):
                raise HfspecError(
                    f"{role}: no such GGUF file {gguf_file!r} in folder {expanded!r}{_gguf_listing(expanded)}"
                )
            return ResolvedSource("gguf", os.path.abspath(expanded), gguf_file)
        if os.path.isfile(expanded):
            raise HfspecError(
                f"{role}: {source!r} is a file; with gguf_file= pass the folder that holds it "
                "(or pass the .gguf path alone)"
            )
        if _looks_like_path(source) or not _is_repo_id(source):
            raise HfspecError(
                f"{role}: no such folder {expanded!r} (to read the GGUF file {gguf_file!r} from); allowed: an "
                "existing folder or a hub id with gguf_file=, or the .gguf path alone"
            )
        return ResolvedSource("hub", source, gguf_file)

    if os.path.isdir(expanded):
        folder = os.path.abspath(expanded)
        if os.path.isfile(os.path.join(folder, "config.json")):
            return ResolvedSource("folder", folder)
        ggufs = _gguf_files(folder)
        if len(ggufs) == 1:
            return ResolvedSource(
                "gguf",
                folder,
                ggufs[0],
                note=f"{folder} has no config.json; using its only GGUF file {ggufs[0]}",
            )
        if ggufs:
            raise HfspecError(
                f"{role}: folder {folder!r} has no config.json and several GGUF files; "
                f"pick one: {', '.join(ggufs)} (pass folder/file.gguf)"
            )
        raise HfspecError(
            f"{role}: folder {folder!r} has no config.json, so it is not a Hugging Face model "
            "folder; allowed: a folder with config.json and weights (*.safetensors), "
            "a .gguf file, or a hub id"
        )
    if os.path.isfile(expanded):
        path = os.path.abspath(expanded)
        folder, name = os.path.split(path)
        if name.lower().endswith(".gguf"):
            return ResolvedSource("gguf", folder, name)
        if os.path.isfile(os.path.join(folder, "config.json")):
            return ResolvedSource("folder", folder, note=f"{name} is a file; loading its folder {folder}")
        raise HfspecError(
            f"{role}: {path!r} is a file but not a .gguf file, and its folder has no "
            "config.json; allowed: a model folder, a .gguf file, or a hub id"
        )
    # not on disk: a hub id, or a mistyped path
    if source.lower().endswith(".gguf") and source.count("/") == 2 and not _looks_like_path_prefix(source):
        repo, name = source.rsplit("/", 1)  # "org/repo/file.gguf" on the hub
        if _is_repo_id(repo):
            return ResolvedSource("hub", repo, name)
    if source.lower().endswith(".gguf"):
        folder = os.path.dirname(os.path.abspath(expanded))
        listing = _gguf_listing(folder) if os.path.isdir(folder) else f"; the folder {folder!r} does not exist"
        raise HfspecError(
            f"{role}: no such GGUF file {expanded!r}{listing} (allowed: an existing .gguf file, a local folder, "
            "or a hub id like 'org/name')"
        )
    if _looks_like_path(source) or not _is_repo_id(source):
        raise HfspecError(
            f"{role}: no such folder or file: {expanded!r} (allowed: a local folder, "
            "a .gguf file, or a hub id like 'org/name')"
        )
    return ResolvedSource("hub", source)


def _looks_like_path_prefix(text: str) -> bool:
    return os.path.isabs(text) or text.startswith((".", "~"))


def _gguf_files(folder: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if n.lower().endswith(".gguf"))
    except OSError:
        return []


def _gguf_listing(folder: str) -> str:
    files = _gguf_files(folder)
    return f"; GGUF files there: {', '.join(files)}" if files else "; the folder has no .gguf files"


# --------------------------------------------------------------------------------------------------------------
# helpers shared by model and tokenizer loading


def _offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (the env) or at import (huggingface_hub)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _need_gguf(role: str, src: ResolvedSource):
    if importlib.util.find_spec("gguf") is None:
        raise HfspecError(
            f"{role}: loading the GGUF file {src.describe()!r} needs the 'gguf' package, which is "
            "not installed; install it with: pip install 'hfspec[gguf]'  (or: pip install gguf)"
        )


def _common_kwargs(src: ResolvedSource, trust_remote_code: bool) -> dict:
    kw: dict[str, Any] = {"trust_remote_code": bool(trust_remote_code)}
    if src.gguf_file:
        kw["gguf_file"] = src.gguf_file
    if src.kind != "hub" or _offline():
        kw["local_files_only"] = True
    return kw


def _translate(exc: Exception, src: ResolvedSource, role: str, what: str) -> HfspecError:
    """Turn an OSError/ValueError from transformers into an HfspecError that says what to do."""
    text = str(exc)
    low = text.lower()
    if "trust_remote_code" in low or "custom code" in low:
        return HfspecError(
            f"{role}: {src.describe()!r} needs custom code from its repository; allowed: "
            "trust_remote_code=True (only if you trust that code); it is off by default"
        )
    if src.kind == "hub":
        offline = _offline()
        unreachable = any(
            s in low
            for s in (
                "couldn't connect",
                "could not connect",
                "offline mode",
                "cannot reach",
                "connection",
                "cached files",
                "local cache",
            )
        )
        if offline or unreachable:
            why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
            return HfspecError(
                f"{role}: hub id {src.describe()!r} is not in the local cache and {why}; download it once while "
                f"online (e.g. `hf download {src.path}`), or pass a local folder or .gguf file "
                f"(no local folder {os.path.abspath(src.path)!r} exists either)"
            )
        if "not a valid model identifier" in low or "repository not found" in low or "404" in low:
            return HfspecError(
                f"{role}: {src.describe()!r} is not a model on the hub (or it is private/gated "
                "and needs `hf auth login`); allowed: a local folder, a .gguf file, or a hub id"
            )
    if "gguf" in low and isinstance(exc, (ImportError, ModuleNotFoundError)):
        return HfspecError(f"{role}: reading GGUF needs the 'gguf' package: pip install 'hfspec[gguf]'")
    return HfspecError(f"{role}: could not load the {what} from {src.describe()!r}: {text.strip()}")


_LOAD_LOCK = threading.RLock()  # held around every from_pretrained of load_model (see check_loaded)
_RACE = (
    "another thread was probably loading a model with transformers at the same time (its loading is not "
    "thread-safe); allowed: one load at a time (hfspec's load_model serialises its own; restart the process "
    "if loads outside hfspec overlapped)"
)
_tls = threading.local()  # per-thread progress mode of the load in progress (None: no hfspec load)
_hook_lock = threading.Lock()
_hook_installed = False


class _CallbackBar:
    """Stands in for one of transformers' tqdm bars: forwards "desc: n/total" to a progress callable
    (at most about every 0.25 s, and at the end) instead of drawing on the terminal."""

    def __init__(self, bar, callback, args, kwargs):
        self._bar = bar
        self._callback = callback
        self._iterable = args[0] if args else kwargs.get("iterable")
        self.desc = kwargs.get("desc") or "loading"
        total = kwargs.get("total")
        if total is None and self._iterable is not None:
            try:
                total = len(self._iterable)
            except TypeError:
                total = None
        self.total = total
        self.n = 0
        self._last = 0.0

    def _tick(self, force=False):
        now = time.perf_counter()
        if force or now - self._last >= 0.25:
            self._last = now
            self._callback(f"{self.desc}: {self.n}/{self.total}" if self.total else f"{self.desc}: {self.n}")

    def __iter__(self):
        for item in self._iterable if self._iterable is not None else ():
            yield item
            self.n += 1
            self._tick(self.n == self.total)

    def update(self, n=1):
        self.n += n
        self._tick(self.total is not None and self.n >= self.total)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):  # set_postfix, refresh, ... -> the (disabled) real bar
        return getattr(self._bar, name)


def _install_tqdm_hook():
    """transformers creates its "Loading weights" bars through utils.logging.tqdm, which takes a hook. Ours
    only acts inside a hfspec load on the same thread (no global switch is flipped, so loads in worker
    threads do not disturb each other) and otherwise defers to any previous hook."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        try:
            from transformers.utils import logging as hf_logging

            setter = hf_logging.set_tqdm_hook
        except (ImportError, AttributeError):
            _hook_installed = True  # older transformers: bars follow their own global setting
            return
        previous = None

        def hook(factory, args, kwargs):
            mode = getattr(_tls, "progress", None)
            if mode is None or mode is True:
                return previous(factory, args, kwargs) if previous else factory(*args, **kwargs)
            bar = factory(*args, **{**kwargs, "disable": True})
            return _CallbackBar(bar, mode, args, kwargs) if callable(mode) else bar

        previous = setter(hook)
        _hook_installed = True


def _report(progress: Progress, message: str):
    if progress is None or progress is False:
        return
    if callable(progress):
        progress(message)
    else:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# public API


def load_model(
    source,
    *,
    dtype=None,
    device=None,
    device_map=None,
    max_memory=None,
    offload_folder=None,
    trust_remote_code: bool = False,
    gguf_file=None,
    progress: Progress = True,
    role: str = "model",
    **from_pretrained_kwargs,
):
    """Load a causal LM from a local folder, a .gguf file or a hub id, ready for decoding (eval mode).

    dtype: "float32" | "bfloat16" | "float16" | "auto" | a torch dtype | None. None means float32 when the
        model ends up on the CPU (half precision is slow there and GGUF is dequantised to it) and the
        checkpoint's own dtype ("auto") on a GPU.
    device: "cpu" | "cuda" | "cuda:N" | "mps" | "auto" (best single device) | None (CPU). Mutually exclusive
        with device_map.
    device_map, max_memory, offload_folder: accelerate placement (sharding, CPU/disk offload). ``max_memory``
        alone implies ``device_map="auto"``.
    trust_remote_code: off unless turned on.
    gguf_file: file name inside ``source`` (a folder or hub id); a path ending in .gguf works on its own.
    progress: True prints "loading <source> (<dtype>, <device>)…" and "loaded <source> in N s" to stderr,
        next to transformers' own tqdm bars; a callable receives those lines instead, plus throttled
        "Loading weights: n/total" lines in place of the bars (for a GUI busy state or progress bar);
        False/None is silent (bars off for this load only, thread-local; the GGUF dequantisation bar of
        transformers does not go through its hook and still shows).
    role: the name used in error messages ("target", "draft").
    Extra keyword arguments go to ``AutoModelForCausalLM.from_pretrained`` unchanged (e.g. revision).
    """
    role = role or "model"
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

    src = resolve_source(source, gguf_file=gguf_file, role=role)
    if src.gguf_file:
        _need_gguf(role, src)

    if dev is not None:
        placement = dev
    elif dmap is None:
        placement = "cpu"
    else:
        placement = dmap if isinstance(dmap, str) else "device_map " + _summarise_map(dmap)
    if torch_dtype is None:
        torch_dtype = torch.float32 if _all_on_cpu(dev, dmap) else "auto"
    dtype_name = torch_dtype if isinstance(torch_dtype, str) else str(torch_dtype).replace("torch.", "")

    kwargs = _common_kwargs(src, trust_remote_code)
    kwargs["dtype"] = torch_dtype
    if dev is not None and dev != "cpu":
        kwargs["device_map"] = dev
    if dmap is not None:
        kwargs["device_map"] = dmap
    if max_memory is not None:
        kwargs["max_memory"] = dict(max_memory)
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)
        kwargs["offload_folder"] = os.fspath(offload_folder)
    kwargs.update(from_pretrained_kwargs)

    if src.note:
        _report(progress, f"{role}: {src.note}")
    _report(progress, f"loading {src.describe()} ({dtype_name}, {placement})…")
    start = time.perf_counter()
    from transformers import AutoModelForCausalLM

    _install_tqdm_hook()
    want_info = bool(kwargs.pop("output_loading_info", False))
    ignore_mismatched = bool(kwargs.pop("ignore_mismatched_sizes", False))
    saved = getattr(_tls, "progress", None)
    _tls.progress = progress if callable(progress) else bool(progress)
    try:
        with _LOAD_LOCK:  # transformers swaps class attributes while loading: one load at a time per process
            loaded = AutoModelForCausalLM.from_pretrained(
                src.path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
            model, info = loaded if isinstance(loaded, tuple) else (loaded, {})
            check_loaded(model, info, role, src.describe(), ignore_mismatched)
    except HfspecError:
        raise
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise _translate(exc, src, role, "model") from exc
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":
            raise
        raise _damaged_weights(exc, src, role) from exc
    finally:
        _tls.progress = saved
    if src.gguf_file:
        _drop_gguf_quantizer(model)
    model.eval()
    elapsed = time.perf_counter() - start
    n_params = sum(p.numel() for p in model.parameters())
    _report(progress, f"loaded {src.describe()} in {elapsed:.1f} s ({_human(n_params)} parameters)")
    return (model, info) if want_info else model


def load_tokenizer(
    source, *, gguf_file=None, trust_remote_code: bool = False, role: str = "model", **from_pretrained_kwargs
):
    """Load the tokenizer that goes with ``source`` (same spellings as :func:`load_model`)."""
    role = role or "model"
    src = resolve_source(source, gguf_file=gguf_file, role=role)
    if src.gguf_file:
        _need_gguf(role, src)
    elif src.kind == "folder" and not any(
        os.path.isfile(os.path.join(src.path, n)) for n in _TOKENIZER_FILES
    ):
        raise HfspecError(
            f"{role}: folder {src.path!r} has no tokenizer (allowed: a folder with "
            f"{', '.join(_TOKENIZER_FILES[:3])}, a .gguf file, or a hub id)"
        )
    kwargs = _common_kwargs(src, trust_remote_code)
    kwargs.update(from_pretrained_kwargs)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src.path, **kwargs)
    except HfspecError:
        raise
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise _translate(exc, src, role, "tokenizer") from exc


def check_loaded(model, info: dict, role: str, where: str, ignore_mismatched: bool = False) -> None:
    """Refuse a model that is not exactly its checkpoint: weights the config expects but the files lack (they
    would be random), weights the files hold but the config has no place for, shape mismatches, parameters
    left on the meta device, and tied weights that are not tied. The last two happen when two threads load at
    once (transformers replaces `PreTrainedModel.tie_weights` while loading), which `_LOAD_LOCK` prevents
    for hfspec's own loads."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    untied = sorted(set(info.get("missing_keys") or ()) & set(tied))  # tying skipped: reported as missing
    if untied:
        raise HfspecError(
            f"{role}: tensor {untied[0]} of {where!r} should be tied to {tied[untied[0]]} but was not tied while "
            f"loading; {_RACE}"
        )
    problems = [
        ("missing from the weight files (it would be random)", sorted(info.get("missing_keys") or ())),
        ("in the weight files but not in the model config", sorted(info.get("unexpected_keys") or ())),
        ("of a different shape in the weight files", [] if ignore_mismatched else
         [f"{k} {tuple(a)} vs {tuple(b)}" for k, a, b in sorted(info.get("mismatched_keys") or ())]),
        ("not loadable", list(info.get("error_msgs") or ())),
    ]
    for what, names in problems:
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise HfspecError(
                f"{role}: tensor {shown} {what}; config.json of {where!r} does not match its weights; "
                "allowed: a config.json that describes the weights (layers, sizes, vocabulary)"
            )
    hooked = [name for name, module in model.named_modules() if hasattr(module, "_hf_hook")]  # accelerate
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta and not any(h == "" or name.startswith(h + ".") for h in hooked):
            raise HfspecError(f"{role}: tensor {name} of {where!r} was left on the meta device (never loaded); {_RACE}")
    for name, source in tied.items():
        try:
            a, b = model.get_parameter(name), model.get_parameter(source)
        except AttributeError:
            continue
        if a is not b and not a.is_meta and not b.is_meta and a.data_ptr() != b.data_ptr():
            raise HfspecError(
                f"{role}: tensor {name} of {where!r} should be tied to {source} but is a separate tensor; {_RACE}"
            )


def _damaged_weights(exc: Exception, src: ResolvedSource, role: str) -> HfspecError:
    """The weight file safetensors could not read (truncated, empty), found by opening each in turn."""
    bad = src.describe()
    if src.local and not src.gguf_file:
        from safetensors import safe_open

        for name in sorted(n for n in os.listdir(src.path) if n.endswith(".safetensors")):
            try:
                with safe_open(os.path.join(src.path, name), "pt"):
                    pass
            except Exception:
                bad = os.path.join(src.path, name)
                break
    return HfspecError(
        f"{role}: weight file {bad!r} is damaged ({str(exc).strip()}); allowed: a complete .safetensors file "
        "(truncated or empty files come from interrupted downloads or copies: fetch it again)"
    )


def _drop_gguf_quantizer(model):
    """transformers dequantises GGUF weights into ordinary tensors but leaves a GGUF "quantizer" attached,
    which makes ``.half()``/``.float()`` refuse and would be saved into config.json. The model is a plain
    dense model, so detach it."""
    from transformers import PreTrainedModel

    config = getattr(model, "config", None)
    qc = getattr(config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if str(getattr(method, "value", method)).lower() != "gguf":
        return
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)  # hf_quantizer, config entry, quantization_method, ...
    for name in ("hf_quantizer", "quantization_method"):
        model.__dict__.pop(name, None)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    model.is_quantized = False
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and getattr(module.config, "_is_quantized", False):
            module.config._is_quantized = False


def _all_on_cpu(dev, dmap) -> bool:
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


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
