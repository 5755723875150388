"""hfspec as a transformers `custom_generate` folder (a Hub repository or a local folder).

    hfspec export-hub OUT                  # writes OUT/custom_generate/generate.py, requirements.txt, README.md
    target.generate(ids, custom_generate="OUT", trust_remote_code=True, draft="rtn4", gamma=4, max_new_tokens=64)

transformers 5 loads `custom_generate/generate.py` from the folder (or a Hub repository holding it), checks
`custom_generate/requirements.txt` against the installed packages, and calls its `generate(model, ...)` with every
argument of the `generate` call: the string form also passes `streamer`, `tokenizer` and the generation-config
pieces, which the callable form drops. A local folder needs `trust_remote_code=True` as well.

The written generate.py is a few lines that import the installed hfspec (named in requirements.txt) and call
`hub_generate` below, so the folder does not carry a copy of hfspec that could drift from the installed one.
`hub_generate` turns the draft argument into a draft (a spec string, a model, or a folder), keeps drafts built
from a spec on the target (`model._hfspec_hub_drafts`, keyed by the spec's canonical label) so later calls reuse
them, and runs transformers' own `generate` with hfspec's decoding loop, so generation configs, logits
processors, stopping criteria, stop strings, streamers and `return_dict_in_generate` behave as in `generate`.
"""

from __future__ import annotations

import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from torch import nn

from hfspec import validate
from hfspec.api import speculative_generate
from hfspec.drafts import make_draft, parse_draft_spec
from hfspec.errors import HfspecError
from hfspec.io.export_draft import check_out_folder

CACHE_ATTRIBUTE = "_hfspec_hub_drafts"
DEFAULT_DRAFT = "rtn4"
DEFAULT_GAMMA = 4
# hfspec's tested range (the releases whose `hub_generate` this generate.py calls). hfspec's own dependencies
# bound torch and transformers; transformers reads the installed metadata of every line on every call
# (about 10 ms a line), so the file names only what the folder itself needs.
REQUIREMENTS = ("hfspec>=0.1.0", "hfspec<0.2")
# generate()'s own parameters that hfspec's loop takes over or refuses (assisted decoding is what hfspec does)
_GENERATE_PARAMETERS = ("generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                        "synced_gpus", "streamer", "negative_prompt_ids", "negative_prompt_attention_mask")


def hub_generate(model, inputs=None, *, draft=None, gamma=None, draft_options: dict | None = None,
                 assistant_model=None, default_draft: str = DEFAULT_DRAFT, default_gamma=DEFAULT_GAMMA, **kwargs):
    """What the exported `custom_generate/generate.py` runs: speculative decoding of `model` with hfspec.

    draft: a spec string ("rtn4", "rtn3-g64", "lookup", a sibling folder or hub id), a draft model, or None for
        `default_draft` (the folder's default; transformers' own `assistant_model=` is taken as the draft too).
    gamma: tokens drafted per target pass (an integer 1..64 or "auto"); None: `default_gamma`.
    draft_options: keyword options for `hfspec.make_draft` (e.g. {"lean": False}); part of the cache key.
    Everything else is `generate`'s: inputs / input_ids, attention_mask, max_new_tokens, do_sample, temperature,
    top_k, top_p, generation_config, logits_processor, stopping_criteria, stop_strings with tokenizer, streamer,
    return_dict_in_generate (the dict is hfspec's SpeculativeOutput: sequences, stats, token_kinds), seed.
    """
    if assistant_model is not None:
        if draft is not None:
            raise HfspecError("draft: got both draft= and assistant_model=; allowed: one of them (the draft)")
        draft = assistant_model
    spec = default_draft if draft is None else draft
    gamma = default_gamma if gamma is None else gamma
    validate.check_gamma(gamma)
    if draft_options is not None and not isinstance(draft_options, dict):
        raise validate.bad_value("draft_options", draft_options, "a dict of hfspec.make_draft options, or None")
    draft_model = draft_for(model, spec, **(draft_options or {}))
    passed = {name: kwargs.pop(name) for name in _GENERATE_PARAMETERS if kwargs.get(name) is not None}
    # The class's generate, not the instance's: a model loaded from a repository with custom_generate has its
    # `generate` replaced by that repository's function, which would call back into this one.
    return type(model).generate(model, inputs, custom_generate=speculative_generate, draft_model=draft_model,
                                gamma=gamma, **passed, **kwargs)


def draft_for(model: nn.Module, spec, **options) -> nn.Module:
    """The draft of `model` for `spec`: a model is used as given; a spec string or folder is built once and kept
    on `model` (keyed by its canonical label and the options), so later calls reuse it. Bad specs raise
    HfspecError naming `draft` and the allowed specs, before anything is built."""
    parsed = parse_draft_spec(spec)
    if parsed.kind == "model":
        return make_draft(model, parsed.source, **options)
    key = (parsed.label, tuple(sorted((k, repr(v)) for k, v in options.items())))
    cache = model.__dict__.setdefault(CACHE_ATTRIBUTE, {})
    if key not in cache:
        cache[key] = make_draft(model, spec, **options)
    return cache[key]


def forget_drafts(model: nn.Module) -> int:
    """Drop the drafts kept on `model` (after changing its weights); returns how many there were."""
    return len(model.__dict__.pop(CACHE_ATTRIBUTE, {}) or {})


def requirements() -> list[str]:
    """requirements.txt lines: one bound per line, since transformers checks only the first bound of a line."""
    return list(REQUIREMENTS)


def export_hub(out, *, draft: str = DEFAULT_DRAFT, gamma=DEFAULT_GAMMA, overwrite: bool = False) -> Path:
    """Write a `custom_generate` folder to `out`; `draft` and `gamma` are its defaults (checked first)."""
    if not isinstance(draft, str):
        raise validate.bad_value("draft", type(draft).__name__, "a draft spec string (the folder's default)")
    parse_draft_spec(draft)
    validate.check_gamma(gamma)
    folder = check_out_folder(out, overwrite)
    if folder.exists() and overwrite:
        shutil.rmtree(folder)
    code = folder / "custom_generate"
    code.mkdir(parents=True, exist_ok=True)
    (code / "generate.py").write_text(generate_py(draft, gamma))
    (code / "requirements.txt").write_text("\n".join(requirements()) + "\n")
    (folder / "README.md").write_text(readme(draft, gamma))
    return folder


def installed_version() -> str:
    try:
        return version("hfspec")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(source tree)"


def generate_py(draft: str, gamma) -> str:
    return _GENERATE_PY.format(version=installed_version(), draft=draft, gamma=repr(gamma))


def readme(draft: str, gamma) -> str:
    reqs = "\n".join(requirements())
    return _README.format(draft=draft, gamma=repr(gamma), requirements=reqs, version=installed_version())


_GENERATE_PY = '''"""Speculative decoding with hfspec as a transformers `custom_generate` function (written by hfspec {version}).

    model.generate(input_ids, custom_generate="<this folder or repo>", trust_remote_code=True,
                   draft="{draft}", gamma={gamma}, max_new_tokens=64)

draft: a spec ("rtn4", "rtn3-g64", "lookup", ...), a folder or hub id of a smaller sibling, or a model.
gamma: tokens drafted per target pass, 1..64 or "auto". Every other argument is generate's own.
The decoding runs in the installed hfspec package (see requirements.txt); this file only forwards to it.
"""

DRAFT = "{draft}"  # the draft when the call names none
GAMMA = {gamma}


def generate(model, *args, draft=None, gamma=None, **kwargs):
    try:
        from hfspec.hub_export import hub_generate
    except ImportError as error:
        raise ImportError("this custom_generate folder runs hfspec: pip install hfspec "
                          "(see custom_generate/requirements.txt)") from error
    return hub_generate(model, *args, draft=draft, gamma=gamma, default_draft=DRAFT, default_gamma=GAMMA, **kwargs)
'''

_README = '''---
library_name: transformers
tags:
  - custom_generate
  - speculative-decoding
---

# hfspec: exact speculative decoding as `custom_generate`

A draft proposes γ tokens, the model checks them in one pass and keeps each with probability min(1, p/q),
so the output is distributed exactly as the model's own samples (Leviathan et al., 2023; Chen et al., 2023);
greedy decoding gives the model's greedy text token for token. The draft is built from the model itself:
a round-to-nearest quantised copy (`rtn4` = 4 bits in groups of 32), a smaller sibling, or prompt lookup.

## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
tok = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
ids = tok("The capital of France is", return_tensors="pt")
out = model.generate(**ids, custom_generate="<this repo or folder>", trust_remote_code=True,
                     draft="{draft}", gamma={gamma}, max_new_tokens=64, do_sample=False)
print(tok.decode(out[0]))
```

- `draft`: `rtn2`..`rtn8` with `-gN` for the group size (and `-compiled` for a compiled draft step),
  `bnb-nf4` / `bnb-fp4` / `bnb-int8`, `lookup` (prompt lookup), a folder or hub id of a smaller model with the
  same tokenizer, or a model object. Default: `{draft}`. A draft built from a spec is kept on the model and
  reused by later calls; `hfspec.hub_export.forget_drafts(model)` drops it after you change the weights.
- `gamma`: tokens drafted per pass, 1..64, or `"auto"` (adapts to the acceptance rate). Default: {gamma}.
- `draft_options`: a dict of `hfspec.make_draft` options, e.g. `{{"lean": False}}`.
- Everything else is `generate`'s own: sampling settings, `generation_config`, `logits_processor`,
  `stopping_criteria`, `stop_strings` with `tokenizer=`, `streamer`, `return_dict_in_generate` (the output then
  also has `stats`, hfspec's acceptance statistics, and `token_kinds`). Beam search, contrastive search and
  `output_scores` / `output_logits` are refused with an error naming the option.

## Requirements

`custom_generate/generate.py` imports the installed `hfspec` package (written by hfspec {version});
transformers checks `custom_generate/requirements.txt` before running it:

```
{requirements}
```

Install with `pip install hfspec` (or from its repository). `trust_remote_code=True` is needed even for a
local folder: transformers runs `custom_generate/generate.py`, which only forwards to hfspec.
'''
