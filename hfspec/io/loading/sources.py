"""Where a model comes from: a local folder, a .gguf file or a hub id (offline-aware)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hfspec.errors import HfspecError
from hfspec.extras import require_extra

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
)
NAME_MAX = 255  # bytes in one folder or file name on the usual file systems (ext4, btrfs, APFS, NTFS)


def check_name_lengths(source: str, role: str = "model",
                       allowed: str = "a model folder, a .gguf file or a hub id") -> None:
    """HfspecError naming `role` when a folder or file name in the path `source` is longer than NAME_MAX bytes,
    which the operating system refuses ("File name too long"): said before anything is looked up or loaded."""
    for part in os.path.expanduser(source).replace("\\", "/").split("/"):
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > NAME_MAX:
            raise HfspecError(
                f"{role}: the name {part[:32] + '…'!r} in {source[:48] + '…'!r} is {size} bytes long, over the "
                f"{NAME_MAX} a folder or file name can have; allowed: {allowed} whose names are at most "
                f"{NAME_MAX} bytes each"
            )



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
    check_name_lengths(source if gguf_file is None else os.path.join(source, os.fspath(gguf_file)), role)
    expanded = os.path.expanduser(source)
    if gguf_file is not None:
        return _with_gguf_file(source, expanded, os.fspath(gguf_file), role)
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


def _with_gguf_file(source: str, expanded: str, gguf_file: str, role: str) -> ResolvedSource:
    """`source` given together with `gguf_file=`: a folder holding it, or a hub id."""
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



def hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (the env) or at import (huggingface_hub)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def need_gguf(role: str, src: ResolvedSource):
    require_extra("gguf", role, f"loading the GGUF file {src.describe()!r}")


def common_kwargs(src: ResolvedSource, trust_remote_code: bool) -> dict:
    kw: dict[str, Any] = {"trust_remote_code": bool(trust_remote_code)}
    if src.gguf_file:
        kw["gguf_file"] = src.gguf_file
    if src.kind != "hub" or hub_offline():
        kw["local_files_only"] = True
    return kw


