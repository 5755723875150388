"""A cost profile measured on this machine for one pair: what a seeded γ "auto" prices rounds with, in place of the
priors, where one was saved.

Why: the priors (`hfspec.decoding.priors`) are measurements of a few 2-core VMs, looked up by the CPU's kind, and a
machine of another kind takes the nearest row, which can be far off. On a 2-core Intel Xeon whose hypervisor hides
AMX (so `hfspec.kernels.cpu` calls it "cpu", the AMD EPYC's row), a SmolLM2-135M fp32 verify pass of 5 positions
through the few-row kernel costs 1.21 one-token steps where that row says 0.64 (6 December 2026,
benchmarks/results/xeon-noamx-2c-2026-12-06-verify-width.md). `hfspec profile` (`hfspec.measure.profile`) times the
pair's own rounds at fixed γ and plain decoding here, and saves the records (not a fit: a later hfspec refits them)
under a key of everything that sets those costs: the CPU's name and kind, torch's threads and version, the target's
shape, dtype and linear path ("+rows", "+prepack"), the draft's spec, bytes and storage, and greedy or sampled. A
seeded run with γ "auto" whose key matches a saved profile decides from it (`ProfileModel`); its text is then fixed
by the seed and that file, never by this run's clock, and `SpecStats.cost_profile` names the file. A profile for other
settings is never used; an unreadable one is skipped with a warning. `$HFSPEC_COST_PROFILE`: "auto" (default: use a
matching profile) or "off" (the priors); `$HFSPEC_PROFILE_DIR`: where profiles live (default
~/.cache/hfspec/profiles)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

import torch

from hfspec.decoding.costmodel import CostModel, _line, _populated
from hfspec.decoding.costrecord import CostRecord
from hfspec.errors import HfspecError, bad_value
from hfspec.kernels.cpu import cpu_kind, cpu_name

MODE_ENV = "HFSPEC_COST_PROFILE"
MODES = ("auto", "off")
DIR_ENV = "HFSPEC_PROFILE_DIR"
FORMAT = 1  # a file of another format is not read
# the target's config fields that set a forward's cost (a checkpoint of the same shape costs the same)
SHAPE_FIELDS = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings")

_warned: set[str] = set()


def mode() -> str:
    """`$HFSPEC_COST_PROFILE` ("auto" when unset); another value is refused by name."""
    value = os.environ.get(MODE_ENV, "") or "auto"
    if value not in MODES:
        raise bad_value(MODE_ENV, value, "auto (use a saved cost profile that matches) or off (the priors)")
    return value


def profile_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "hfspec" / "profiles").expanduser()


def profile_key(target, draft: dict, dtype: str, device: str, sampled: bool) -> dict:
    """What a profile is valid for. `draft`: {"spec", "bytes", "storage"}; `dtype`: the target's dtype with its
    linear path ("float32+rows"); `device`: the device type."""
    config = getattr(target, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    shape = {name: getattr(config, name, None) for name in SHAPE_FIELDS}
    return {"format": FORMAT, "cpu": cpu_name(), "cpu_kind": cpu_kind(), "threads": torch.get_num_threads(),
            "torch": torch.__version__.split("+")[0], "device": device, "target": shape, "dtype": dtype,
            "draft": dict(draft), "sampling": "sampled" if sampled else "greedy"}


def path_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return profile_dir() / f"{digest}.json"


@dataclass
class ProfileModel(CostModel):
    """`CostModel` fitted to a profile: a one-token pass costs `step` (plain decoding's); a verify pass of 2 or
    more positions follows `points`, the speculative rounds' own widths made non-decreasing (`monotone`), linear
    between them, flat below the first and rising past the last at the mean slope across them (the `verify_b` line's
    where that is steeper). Not a line through them: the few-row kernel's passes are flat over a few positions and
    then step up (SmolLM2-135M bf16 on an Intel Xeon without AMX, 6 December 2026: 30.5–34.5 ms for 3–6 positions,
    39.1 and 41.4 for 7 and 8), and a line through them priced long rounds low, so seeded γ auto drafted longer than
    the best fixed γ; nor through the one-token step, which plain decoding takes by another product."""

    points: tuple = ()  # ((width, seconds), ...), widths ≥ 2, increasing, seconds non-decreasing

    def verify(self, n: int) -> float:
        if n <= 1:
            return self.step
        if not self.points:
            return max(0.0, self.verify_a + self.verify_b * n)
        (n0, t0), (n1, t1) = self.points[0], self.points[-1]
        if n <= n0:
            return t0
        if n >= n1:
            slope = max(self.verify_b, (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0)
            return t1 + slope * (n - n1)
        for (a, ta), (b, tb) in zip(self.points, self.points[1:], strict=False):
            if a <= n <= b:
                return ta + (tb - ta) * (n - a) / (b - a)
        return t1


def monotone(points: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """The non-decreasing fit, weighted by rounds, of (width, seconds, rounds) points sorted by width (pool adjacent
    violators): a noisy dip between two widths is averaged away; a real step up stays."""
    blocks: list[list] = []  # [sum of w·y, sum of w, widths]
    for n, y, w in sorted(points):
        blocks.append([w * y, w, [n]])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
    return [(n, wy / w) for wy, w, widths in blocks for n in widths]


@dataclass
class CostProfile:
    """The records of one pair's rounds on one machine (`key`): speculative rounds at the fixed γ of `gammas` and
    a plain run's, with when and how they were taken."""

    key: dict
    record: CostRecord
    plain: CostRecord
    gammas: list[int] = field(default_factory=list)
    created: str = ""
    tokens: int = 0  # new tokens per run
    runs: int = 0  # speculative runs pooled
    # the records of every sampling mode measured with this one, pooled (None: this mode's alone): forwards cost the
    # same greedy or sampled, so their lines take twice the rounds; only the time outside forwards is the mode's own
    forwards: CostRecord | None = None
    plain_forwards: CostRecord | None = None

    def model(self, source: str = "") -> ProfileModel:
        """The cost model of these records: `CostModel.fit` for the time outside forwards (this mode's rounds) and
        for the draft's line (the pooled rounds where there are), plain decoding's one-token step, and the verify
        line over widths ≥ 2."""
        fitted = CostModel.fit(self.record, self.plain)
        pooling = self.forwards is not None and self.plain_forwards is not None
        record, plain = (self.forwards, self.plain_forwards) if pooling else (self.record, self.plain)
        pooled = CostModel.fit(record, plain) if pooling else fitted
        widths = [(n, s / r, r) for n, (r, s) in enumerate(zip(record.width_rounds, record.width_seconds,
                                                                strict=False)) if r and n >= 2]
        a, b = _line(_populated(widths)) if widths else (pooled.verify_a, pooled.verify_b)
        values = {f.name: getattr(fitted, f.name) for f in fields(CostModel)}
        values.update(step=pooled.step, draft_a=pooled.draft_a, draft_b=pooled.draft_b, verify_a=a, verify_b=b,
                      source=source or "cost profile")
        return ProfileModel(**values, points=tuple(monotone(_populated(widths))) if widths else ())

    def to_dict(self) -> dict:
        out = {"key": self.key, "record": self.record.to_dict(), "plain": self.plain.to_dict(),
               "gammas": list(self.gammas), "created": self.created, "tokens": self.tokens, "runs": self.runs}
        if self.forwards is not None and self.plain_forwards is not None:
            out.update(forwards=self.forwards.to_dict(), plain_forwards=self.plain_forwards.to_dict())
        return out

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        record, plain = CostRecord.from_dict(data["record"]), CostRecord.from_dict(data["plain"])
        if record is None or plain is None or not record.rounds or not plain.rounds:
            raise ValueError("a profile needs speculative and plain rounds")
        forwards, plain_forwards = CostRecord.from_dict(data.get("forwards")), CostRecord.from_dict(
            data.get("plain_forwards"))
        return cls(data["key"], record, plain, [int(g) for g in data.get("gammas", [])], str(data.get("created", "")),
                   int(data.get("tokens", 0)), int(data.get("runs", 0)), forwards, plain_forwards)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(key: dict) -> tuple[CostProfile | None, Path]:
    """The saved profile for `key` and its path; None where profiles are off, none was saved, or the file cannot
    be read or holds another key (said once per file as a warning, never used)."""
    path = path_for(key)
    if mode() == "off" or not path.is_file():
        return None, path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            raise ValueError("it was measured for other settings")
        return CostProfile.from_dict(data), path
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        if str(path) not in _warned:
            _warned.add(str(path))
            warnings.warn(f"hfspec: cost profile {path} not used ({error}); γ auto prices rounds from the priors. "
                          "Run `hfspec profile` again to replace it.", stacklevel=2)
        return None, path


def save(profile: CostProfile) -> Path:
    """Write `profile` where `find` looks for its key: to a temporary file renamed into place, so a write killed
    midway or out of disk leaves no profile to read. An unusable folder is a clear error naming $HFSPEC_PROFILE_DIR."""
    path = path_for(profile.key)
    text = json.dumps(profile.to_dict(), indent=1, sort_keys=True) + "\n"
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=".", suffix=".tmp",
                                         delete=False) as handle:
            tmp = handle.name
            handle.write(text)
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise HfspecError(f"{DIR_ENV}: cannot write the cost profile in {str(path.parent)!r} ({error.strerror or error}); "
                          f"allowed: a writable folder (set ${DIR_ENV})") from None
    return path


def describe(profile: CostProfile) -> dict:
    """What the profile says in one target step's units: the draft's step (c) and per-round part, a verify pass of
    2, 5 and 8 positions, the time outside forwards per round and per token, plain decoding's step in ms."""
    model = profile.model()
    step = model.step or 1.0
    return {"step_ms": 1000 * model.step, "c": model.draft_b / step, "draft_round": model.draft_a / step,
            "verify_2": model.verify(2) / step, "verify_5": model.verify(5) / step, "verify_8": model.verify(8) / step,
            "other_round": model.other_a / step, "other_token": model.other_b / step,
            "plain_other": model.plain_other / step}


__all__ = ["CostProfile", "ProfileModel", "describe", "monotone", "find", "mode", "path_for", "profile_dir",
           "profile_key", "save"]
