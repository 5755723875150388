"""Errors from inside transformers and safetensors, re-raised as HfspecError naming the field."""

from __future__ import annotations

import os

from hfspec.errors import HfspecError
from hfspec.extras import missing_extra
from hfspec.io.loading.sources import ResolvedSource, hub_offline


def translate(exc: Exception, src: ResolvedSource, role: str, what: str) -> HfspecError:
    """Turn an OSError/ValueError from transformers into an HfspecError that says what to do."""
    text = str(exc)
    low = text.lower()
    if "trust_remote_code" in low or "custom code" in low:
        return HfspecError(
            f"{role}: {src.describe()!r} needs custom code from its repository; allowed: "
            "trust_remote_code=True (only if you trust that code); it is off by default"
        )
    if src.kind == "hub":
        offline = hub_offline()
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
        return missing_extra("gguf", role, "reading GGUF")
    return HfspecError(f"{role}: could not load the {what} from {src.describe()!r}: {text.strip()}")



def damaged_weights(exc: Exception, src: ResolvedSource, role: str) -> HfspecError:
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


