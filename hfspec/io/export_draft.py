"""Save an RTN draft as a standard quantised checkpoint (compressed-tensors), for transformers and serving engines.

    result = export_draft(target, "rtn4", "out/", tokenizer=tok, gamma=4)
    print(result.serve_command(target_name))

The folder is a compressed-tensors checkpoint (format "pack-quantized": int4 or int8 weights packed into int32,
one scale and one integer zero point per group of `group_size` inputs, activations left in float: "W4A16" /
"W8A16"). transformers reads it with `from_pretrained` (the `compressed-tensors` package, `pip install
'hfspec[export]'`; on the CPU the weights are decompressed to dense float at load time) and vLLM serves it as a
draft model (`--speculative-config '{"method": "draft_model", ...}'`).

How close it is to hfspec's RTN draft: every packed weight within half a step of the float weight, as
hfspec's RTN, though a weight may land on the neighbouring code of hfspec's (the packing and why:
`hfspec.io.pack_quantized`). The embedding and the LM head are written dense with the target's own values (the
engines quantise the decoder's Linear layers; GPTQ and AWQ checkpoints leave the head in float too): the same
bytes as dense RTN values, and the head is where a 4-bit copy loses most of its agreement with the target
(hfspec's own draft re-scores its top logits for that reason, `hfspec.kernels.lean`). A tied pair stays tied.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from hfspec import validate
from hfspec.drafts import make_draft
from hfspec.drafts.registry import parse
from hfspec.errors import HfspecError
from hfspec.extras import extra_version
from hfspec.io.loading import load_model, load_tokenizer
from hfspec.io.pack_quantized import (
    EXPORT_BITS,
    EXPORT_GROUP_SIZES,
    FORMAT,
    PackedLinear,
    load_export,
    pack_linear,
    pack_to_int32,
    quantization_config,
    rtn_dense,
    symmetric_for,
)
from hfspec.quant.known_layers import Conv1D
from hfspec.validate import vocab_size

__all__ = [  # the packing names (`hfspec.io.pack_quantized`) stay importable from here
    "DEFAULT_GAMMA", "EXPORT_BITS", "EXPORT_GROUP_SIZES", "FORMAT", "DraftExport", "PackedLinear", "check_export",
    "check_exportable", "check_out_folder", "export_draft", "export_draft_cli", "load_export", "pack_linear",
    "pack_to_int32", "quantization_config", "rtn_dense", "symmetric_for",
]

DEFAULT_GAMMA = 4
FIXED_GAMMA = "engines take a fixed γ"  # why export-draft refuses gamma "auto"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                    "vocab.json", "merges.txt", "chat_template.jinja", "added_tokens.json")


@dataclass
class DraftExport:
    """What `export_draft` wrote and how close it is to hfspec's RTN draft (`check_export`)."""

    folder: Path
    spec: str                      # canonical spec of the draft, e.g. "rtn4-g32"
    bits: int
    group_size: int
    gamma: int
    gamma_source: str              # where γ came from ("--gamma", "hfspec's default: ...")
    packed_layers: list[str] = field(default_factory=list)
    dense_layers: list[str] = field(default_factory=list)
    groups: int = 0
    widened_groups: int = 0        # groups whose step had to widen to put 0 on the integer grid
    max_error_steps: float = 0.0   # max |exported w - float w| / step over all packed weights (≤ 0.5)
    check: dict | None = None      # load-back check by transformers (`check_export`)

    @property
    def scheme(self) -> str:
        return "symmetric" if symmetric_for(self.bits) else "asymmetric, integer zero points"

    def speculative_config(self) -> dict:
        return {"method": "draft_model", "model": str(self.folder), "num_speculative_tokens": int(self.gamma)}

    def serve_command(self, target: str) -> str:
        """The vLLM command line serving `target` with this draft."""
        config = json.dumps(self.speculative_config())
        return f"vllm serve {_shell_quote(target)} --speculative-config {_shell_quote(config)}"

    def summary(self) -> list[str]:
        lines = [f"wrote {self.folder}: compressed-tensors {FORMAT}, W{self.bits}A16, group size {self.group_size}, "
                 f"{self.scheme}; {len(self.packed_layers)} Linear layers packed, dense: "
                 f"{', '.join(self.dense_layers) or 'none'}",
                 f"rounding: every packed weight within {self.max_error_steps:.3f} step of the float weight "
                 f"(hfspec's RTN: 0.5); {self.widened_groups} of {self.groups} groups widened to reach 0"]
        if self.check is not None:
            c = self.check
            lines.append(f"checked: transformers loads it; logits vs hfspec's {self.spec} with the target's "
                         f"embedding and head: max |Δ| "
                         f"{c['max_abs_diff']:.4g} (their distance to the target: {c['draft_vs_target']:.4g}, "
                         f"export's: {c['export_vs_target']:.4g}); top-1 agreement {c['top1_agreement']:.1%}")
        return lines


def check_exportable(spec):
    """The parsed RTN spec, or HfspecError naming the draft field and what can be exported."""
    allowed = (f"rtn{'/rtn'.join(map(str, EXPORT_BITS))} with -g{'/-g'.join(map(str, EXPORT_GROUP_SIZES))} "
               "(e.g. rtn4, rtn4-g64, rtn8)")
    parsed = parse(spec)
    if parsed.kind == "rtn":
        if parsed.bits not in EXPORT_BITS:
            raise HfspecError(f"draft: {parsed.label} cannot be exported: compressed-tensors checkpoints that "
                              f"engines serve hold {' or '.join(map(str, EXPORT_BITS))}-bit weights; allowed: {allowed}")
        if parsed.group_size not in EXPORT_GROUP_SIZES:
            raise HfspecError(f"draft: group size {parsed.group_size} cannot be exported; allowed: {allowed}")
        if parsed.param("head_top") is not None:
            raise HfspecError(f"draft: {parsed.label} cannot be exported: -topK sets how hfspec's in-memory draft "
                              "re-scores its quantised head, and the export writes the target's own head; "
                              f"allowed: {allowed}")
        return parsed
    why = {
        "bnb": "a bitsandbytes draft is bitsandbytes' own format (save it with save_pretrained of a model loaded "
               "with BitsAndBytesConfig); export an RTN draft instead",
        "gptq": "a calibrated draft's groups have float zero points, and compressed-tensors' integer zero points "
                "cannot hold them without rounding the codes again, which undoes the calibration; export the RTN "
                "draft of the same bits",
        "lookup": "prompt lookup has no weights (vLLM does it itself: --speculative-config "
                  "'{\"method\": \"ngram\", ...}')",
        "sibling": f"a sibling is already a checkpoint: serve {parsed.source} as the draft model directly",
        "model": "a draft model object: save it with save_pretrained",
    }.get(parsed.kind, f"{parsed.kind} drafts have no checkpoint format")
    raise HfspecError(f"draft: {spec if isinstance(spec, str) else parsed.label} cannot be exported: {why}; "
                      f"allowed: {allowed}")


def need_export_extra() -> None:
    """The `export` extra (compressed-tensors: the checkpoint's version and the check that loads it back), or
    HfspecError naming it, before anything loads or is written."""
    extra_version("export", "export", "writing a compressed-tensors checkpoint")


def check_out_folder(out, overwrite: bool = False) -> Path:
    """The output folder: new, empty, or (with overwrite) replaced; HfspecError naming OUT otherwise."""
    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise HfspecError(f"OUT: {str(folder)!r} is a file; allowed: a new or empty folder (or --overwrite)")
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise HfspecError(f"OUT: {str(folder)!r} is not empty; allowed: a new or empty folder (or --overwrite)")
    parent = folder.parent if not folder.exists() else folder
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise HfspecError(f"OUT: {str(folder)!r} is not writable; allowed: a folder you can write")
    return folder


def export_draft(target: nn.Module, spec, out, *, tokenizer=None, gamma: int | None = None, overwrite: bool = False,
                 check: bool = True, progress=None) -> DraftExport:
    """Write the RTN draft `spec` of `target` to `out` as a compressed-tensors checkpoint (plus `tokenizer`).

    gamma: the γ the serving command line proposes (None: hfspec's default, said so in `gamma_source`).
    check: load the folder back with transformers and compare its logits with hfspec's RTN draft (`check_export`).
    """
    from safetensors.torch import save_file

    parsed = check_exportable(spec)
    need_export_extra()
    if gamma is not None:
        validate.check_gamma(gamma, fixed=FIXED_GAMMA)
    folder = check_out_folder(out, overwrite)
    bits, group = parsed.bits, parsed.group_size
    linears, dense = _layers(target, group)
    say = progress or (lambda _message: None)

    result = DraftExport(folder=folder, spec=f"rtn{bits}-g{group}", bits=bits, group_size=group,
                         gamma=int(gamma) if gamma is not None else DEFAULT_GAMMA,
                         gamma_source="--gamma" if gamma is not None else
                         f"hfspec's default ({DEFAULT_GAMMA}); `hfspec sweep` finds your pair's best γ")
    tensors: dict[str, torch.Tensor] = {}
    dtype = _float_dtype(target)
    say(f"packing {len(linears)} Linear layers at {bits} bits, groups of {group}…")
    with torch.no_grad():
        for name, module in linears:
            packed = pack_linear(module.weight, bits, group, dtype)
            tensors.update({f"{name}.{key}": value for key, value in packed.tensors.items()})
            if module.bias is not None:
                tensors[f"{name}.bias"] = module.bias.detach().to(dtype).contiguous()
            result.groups += packed.groups
            result.widened_groups += packed.widened
            result.max_error_steps = max(result.max_error_steps, packed.max_error_steps)
            result.packed_layers.append(name)
        done = {id(m.weight) for _, m in linears}
        biases = {f"{n}.bias" for n, _ in linears}
        dense_names = {n for n, _ in dense}
        written_weights: dict[int, str] = {}
        for key, value in target.state_dict(keep_vars=True).items():
            module_name, _, leaf = key.rpartition(".")
            if id(value) in done or key in biases:
                continue
            if module_name in dense_names and leaf == "weight":
                if id(value) in written_weights:  # tied (embedding and LM head): the checkpoint holds it once
                    result.dense_layers.append(f"{module_name} (tied)")
                    continue
                written_weights[id(value)] = key
                tensors[key] = value.detach().to(dtype).contiguous().clone()  # the target's own values
                result.dense_layers.append(module_name)
                continue
            if id(value) in written_weights:
                continue
            written_weights[id(value)] = key
            tensors[key] = value.detach().contiguous().clone() if value.is_floating_point() else value.detach()
    if folder.exists() and overwrite:
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    say(f"writing {folder}…")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(target.config)
    config.quantization_config = quantization_config(bits, group, ignore=_ignored(target, dense))
    config.dtype = dtype
    config.save_pretrained(folder)
    generation = getattr(target, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(_card(result, target))
    if check:
        say("loading it back with transformers to compare logits…")
        result.check = check_export(target, folder, result.spec)
    return result


def check_export(target: nn.Module, folder, spec: str, tokens: int = 24, seed: int = 0) -> dict:
    """Load `folder` with transformers (CPU) and compare its logits with what it should hold: hfspec's RTN draft
    `spec` of `target` (the Hugging Face forward over dequantised weights) with the target's own embedding and LM
    head, as exported, on random token ids."""
    loaded = load_export(folder)
    draft = reference_draft(target, spec)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size(target), (1, tokens), generator=generator)
    with torch.no_grad():
        want = draft(ids).logits.float()
        got = loaded(ids).logits.float()
        ref = target(ids).logits.float()
    return {
        "max_abs_diff": float((got - want).abs().max()),
        "mean_abs_diff": float((got - want).abs().mean()),
        "draft_vs_target": float((want - ref).abs().mean()),
        "export_vs_target": float((got - ref).abs().mean()),
        "top1_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
        "positions": tokens,
    }


def reference_draft(target: nn.Module, spec: str) -> nn.Module:
    """hfspec's RTN draft `spec` of `target` on the Hugging Face forward, its embedding and LM head the target's
    own modules (shared, not copied): the model an export of `spec` holds, up to the packing's rounding."""
    draft = make_draft(target, spec, lean=False, fused=False)
    for name, module in _layers(target, check_exportable(spec).group_size)[1]:  # the layers an export writes dense
        draft.set_submodule(name, module)
    return draft


def _layers(target: nn.Module, group_size: int) -> tuple[list, list]:
    """(name, module) of the Linear layers to pack and of the layers written dense (embeddings, LM head);
    HfspecError for a weight layer the format cannot hold."""
    head = target.get_output_embeddings()
    linears, dense = [], []
    for name, module in target.named_modules():
        if module is head or isinstance(module, nn.Embedding):
            dense.append((name, module))
        elif isinstance(module, Conv1D):
            raise HfspecError(f"draft: layer {name!r} is a GPT-2 style Conv1D, which compressed-tensors checkpoints "
                              "do not hold; allowed: models whose layers are nn.Linear (Llama, Qwen, Gemma, ...)")
        elif isinstance(module, nn.Linear):
            if type(module).forward is not nn.Linear.forward:
                raise HfspecError(f"draft: layer {name!r} ({type(module).__name__}) is not a plain nn.Linear; "
                                  "allowed: models whose Linear layers are plain nn.Linear")
            if module.in_features % group_size:
                raise HfspecError(f"draft: layer {name!r} has {module.in_features} inputs, not a multiple of group "
                                  f"size {group_size}; allowed: a group size from {EXPORT_GROUP_SIZES} dividing it")
            linears.append((name, module))
    if not linears:
        raise HfspecError(f"draft: {type(target).__name__} has no nn.Linear layers to pack; allowed: a decoder "
                          "with Linear projections")
    return linears, dense


def _ignored(target: nn.Module, dense: list) -> list[str]:
    """Modules compressed-tensors must leave alone: the LM head (written dense)."""
    head = target.get_output_embeddings()
    return [name for name, module in dense if module is head and isinstance(module, nn.Linear)]


def _float_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _card(result: DraftExport, target: nn.Module) -> str:
    name = getattr(target.config, "_name_or_path", "") or type(target).__name__
    return f"""---
library_name: transformers
tags: [compressed-tensors, speculative-decoding, draft-model]
---
# {result.spec} draft of {name}

A round-to-nearest {result.bits}-bit copy of `{name}` in groups of {result.group_size} (no calibration), written by
`hfspec export-draft` as a compressed-tensors `{FORMAT}` checkpoint (W{result.bits}A16, {result.scheme}). The embedding and LM head are dense, holding the target's own values (as GPTQ and AWQ checkpoints keep the head). Use it as the draft model of `{name}`:

```bash
{result.serve_command(name)}
```

```python
from transformers import AutoModelForCausalLM
draft = AutoModelForCausalLM.from_pretrained("{result.folder}")  # needs: pip install compressed-tensors
```

γ = {result.gamma}: {result.gamma_source}.
"""


def export_draft_cli(target: str, spec: str, out, *, gamma: int | None = None, dtype=None, overwrite: bool = False,
                     check: bool = True, say=print) -> int:
    """`hfspec export-draft`: checks the spec, γ and OUT before loading, exports, prints the serving command."""
    check_exportable(spec)
    need_export_extra()
    if gamma is not None:
        validate.check_gamma(gamma, fixed=FIXED_GAMMA)
    check_out_folder(out, overwrite)
    model = load_model(target, dtype=dtype, progress=say, role="target")
    try:
        tokenizer = load_tokenizer(target, role="target")
    except HfspecError as error:
        say(f"note: no tokenizer written ({error})")
        tokenizer = None
    result = export_draft(model, spec, out, tokenizer=tokenizer, gamma=gamma, overwrite=overwrite, check=check,
                          progress=say)
    for line in result.summary():
        say(line)
    say(f"γ {result.gamma}: {result.gamma_source}")
    say("serve the target with this draft (vLLM):")
    print(result.serve_command(target))
    return 0
