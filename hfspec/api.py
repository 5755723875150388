"""Hugging Face drop-in: a `custom_generate` callable and `hfspec.generate` around it.

`target.generate(ids, custom_generate=speculative_generate, draft_model=draft, gamma=4, ...)` lets transformers
prepare everything (generation config, logits processors, stopping criteria, streamer), then runs our loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfspec import validate
from hfspec.attrs import DRAFT_SPEC, FIDELITY, get_attr
from hfspec.decoding import profile as cost_profile
from hfspec.decoding.chain import Chain
from hfspec.decoding.costmodel import CostModel
from hfspec.decoding.coupling import GumbelNoise
from hfspec.decoding.early_exit import check_early_exit, with_early_exit
from hfspec.decoding.gamma import AdaptiveGamma, FixedGamma, GammaPolicy
from hfspec.decoding.loop import DecodeJob, decode, lean_target_capable
from hfspec.decoding.options import check_speculative_options, given_to_generate
from hfspec.decoding.priors import draft_step_prior, prior_model
from hfspec.decoding.request import Hooks, Request, Sampling, Speculation, check_coupling_seed
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.siblings import Tree
from hfspec.decoding.stats import SpecStats
from hfspec.decoding.stopping import Stopper
from hfspec.decoding.trees import draft_storage, make_tree
from hfspec.decoding.verifier import Verifier
from hfspec.drafts import make_draft as _make_draft
from hfspec.drafts import weight_bytes as draft_weight_bytes
from hfspec.drafts.base import Draft, NoDraft, as_draft
from hfspec.dtypes import model_dtype_str
from hfspec.errors import bad_value
from hfspec.kernels import fast_linear, lean_target, native_step, verify_linear
from hfspec.kernels.lean import LeanDecoder


@dataclass
class SpeculativeOutput(GenerateDecoderOnlyOutput):
    """`generate`'s output plus `stats` (SpecStats) and `token_kinds` (per row: accepted/resampled/bonus)."""

    stats: SpecStats | None = None
    token_kinds: list[list[str]] | None = None


def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    draft_model=None,
    gamma: int | str = 4,
    seed: int | None = None,
    on_round=None,
    should_stop=None,
    plain: bool = False,
    stop_strings: str | list[str] | None = None,
    hfspec_request: Request | None = None,
    early_exit: bool = False,
    tree: int | str = 0,
    coupling: str = "rejection",
    **model_kwargs,
):
    """The decoding loop transformers calls after its input preparation (pass as `custom_generate=`).
    `hfspec_request`: the request `hfspec.generate` already checked (the other hfspec arguments are then unused).
    `tree`: 2..8 candidates per unsure draft position (`hfspec.decoding.siblings`), "auto" or a `TreeShape` for a token tree
    (`hfspec.decoding.trees`); 0 or 1 proposes the plain chain. `coupling`: "rejection" or "gumbel" (`hfspec.decoding.coupling`)."""
    request = hfspec_request or Request.for_loop(model, input_ids, draft_model,
                                                 Speculation(gamma, tree, early_exit, coupling), plain=plain,
                                                 seed=seed, hooks=Hooks(on_round, should_stop))
    sampling = bool(generation_config.do_sample)
    check_coupling_seed(request.coupling, request.seed, sampling)
    stopping_criteria = check_speculative_options(model, request.draft, input_ids, generation_config,
                                                  stopping_criteria, streamer, stop_strings)
    streamer = streamer if streamer is not None else given_to_generate("streamer")
    stats = SpecStats(target_bytes=weight_bytes(model), draft_bytes=weight_bytes(request.draft),
                      target_dtype=model_dtype_str(model))
    prices = _Prices.of(model, request.draft, stats, input_ids.device)
    eos = generation_config._eos_token_tensor
    verifier = _verifier(request, stats, prices)
    draft = NoDraft() if request.plain else as_draft(request.draft, vocab=request.draft_vocab)
    if request.plain:
        policy = FixedGamma(0)
    else:  # with a seed, γ "auto" must not read this run's timings: the text must depend on the seed alone
        policy = (_policy(request.gamma, stats, request.draft) if request.seed is None
                  else _frozen_policy(model, request.draft, request.gamma, stats, prices, sampling,
                                      input_ids.shape[0], draft, verifier))
    job = DecodeJob(
        scorer=Scorer(logits_processor, sampling, validate.vocab_size(model)),
        stopper=Stopper(stopping_criteria, eos, generation_config.max_length),
        policy=policy,
        pad_token_id=_pad_id(generation_config._pad_token_tensor, eos),
        generator=_generator(request.seed, input_ids.device),
        streamer=streamer,
        on_round=request.on_round,
        should_stop=request.should_stop,
        stats=stats,
        verifier=verifier,
        noise=GumbelNoise(request.seed) if request.coupling == "gumbel" and sampling else None,
    )
    if request.early_exit:
        check_early_exit(request.early_exit, draft)
        job.policy = early = with_early_exit(job.policy, stats)
        if request.seed is not None:
            early.freeze(prices.c(stats))  # like γ "auto": the text must not depend on timing
    result = decode(model, draft, input_ids, model_kwargs.get("attention_mask"), job)
    if generation_config.return_dict_in_generate:
        return SpeculativeOutput(sequences=result.sequences, stats=result.stats, token_kinds=result.kinds)
    return result.sequences


def generate(
    target,
    input_ids: torch.LongTensor,
    draft=None,
    gamma: int | str = 4,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    attention_mask: torch.Tensor | None = None,
    on_round=None,
    should_stop=None,
    early_exit: bool = False,
    tree: int | str = 0,
    coupling: str = "rejection",
    **generation_kwargs,
) -> SpeculativeOutput:
    """Speculative decoding of `target` with `draft`; returns `.sequences`, `.stats` and `.token_kinds`.

    gamma: draft tokens per round, or "auto" (`hfspec.decoding.gamma`): chosen each round from α and the costs. With a
    `seed`, "auto" and the early exit decide from costs fixed before decoding (the bytes ratio), never from the
    run's timings, so a seed gives the same text run after run whatever the machine's load; without one they
    read the run's timings ("auto" through medians over recent rounds, so a few slow passes do not move it).

    early_exit: the draft may stop a round early (γ is then the cap) when its calibrated confidence and the
    cost model say another token does not pay (`hfspec.decoding.early_exit`); exact, like any proposal.

    temperature 0 means greedy (the target's greedy text, token for token); > 0 samples exactly from the
    target's distribution. Other keyword arguments go to `target.generate` (e.g. `eos_token_id`, `min_p`,
    `repetition_penalty`, `stopping_criteria`, `streamer`, `logits_processor`). `tree` ≥ 2: sibling candidates
    where the draft is unsure, scored in the same target pass (batch size 1; see `hfspec.decoding.siblings`); `tree="auto"`: a
    token tree whose branches continue, sized by the cost model (`hfspec.decoding.trees`; a `TreeShape` fixes its size).

    coupling: "rejection" (default; Leviathan et al.'s rule) or "gumbel", draft-invariant sampling
    (`hfspec.decoding.coupling`; needs a `seed`, no tree): every token is the target's Gumbel-max draw with noise keyed by
    (seed, batch row, position), so the text for a seed is the same whatever the draft and γ, and equal to
    `plain_generate(..., coupling="gumbel")`; fewer proposals are accepted than with "rejection".
    """
    return _run(Request.for_generate(
        target, input_ids, draft, Speculation(gamma, tree, early_exit, coupling), plain=False,
        sampling=Sampling(temperature, top_k, top_p, max_new_tokens, seed), attention_mask=attention_mask,
        hooks=Hooks(on_round, should_stop), generation_kwargs=generation_kwargs))


def plain_generate(
    target,
    input_ids: torch.LongTensor,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    attention_mask: torch.Tensor | None = None,
    on_round=None,
    should_stop=None,
    coupling: str = "rejection",
    **generation_kwargs,
) -> SpeculativeOutput:
    """The baseline: one target pass per token through the same loop (same sampling, same statistics).
    `coupling="gumbel"` samples by Gumbel-max with hfspec's seeded noise: the text `generate` gives with it."""
    return _run(Request.for_generate(
        target, input_ids, None, Speculation(1, coupling=coupling), plain=True,
        sampling=Sampling(temperature, top_k, top_p, max_new_tokens, seed), attention_mask=attention_mask,
        hooks=Hooks(on_round, should_stop), generation_kwargs=generation_kwargs))


def _run(request: Request) -> SpeculativeOutput:
    """`target.generate` with hfspec's loop as `custom_generate`, for a request built by `Request.for_generate`."""
    input_ids, mask = request.input_ids, request.attention_mask
    if request.max_new_tokens == 0:
        return SpeculativeOutput(sequences=input_ids.clone(), stats=SpecStats(gamma=request.shown_gamma),
                                 token_kinds=[[] for _ in range(input_ids.shape[0])])
    return request.target.generate(
        input_ids,
        attention_mask=mask if mask is not None else torch.ones_like(input_ids),
        custom_generate=speculative_generate,
        hfspec_request=request,
        return_dict_in_generate=True,
        **request.generate_kwargs,
    )


def _pad_id(pad: torch.Tensor | None, eos: torch.Tensor | None) -> int:
    if pad is not None:
        return int(pad.flatten()[0])
    return int(eos.flatten()[0]) if eos is not None else 0


def _generator(seed: int | None, device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(int(seed))


def _policy(gamma, stats: SpecStats, draft=None) -> GammaPolicy:
    """The γ policy of a run without a seed: γ "auto" reads the run's timings (robustly, see `hfspec.decoding.gamma`)."""
    if gamma == "auto":
        return AdaptiveGamma(c_prior=stats.c_bytes, costs=stats.costs, alpha_prior=_fidelity(draft))
    return FixedGamma(int(gamma))


def _fidelity(draft) -> float | None:
    """The draft's fidelity as `make_draft` measured it (`hfspec.attrs.FIDELITY`), the α prior of γ "auto"; None
    when not measured (a sibling model you pass, prompt lookup)."""
    value = get_attr(draft, FIDELITY) if draft is not None else None
    return float(value) if isinstance(value, (int, float)) and 0.0 < value <= 1.0 else None


@dataclass(frozen=True)
class _Prices:
    """What a seeded run's priors are looked up by: the device type, the target's dtype ("+prepack" when its
    linears are oneDNN-prepacked, `hfspec.kernels.fast_linear`: a cheaper step and a flatter verify curve; "+rows"
    when its verify passes run the few-row kernel, `hfspec.kernels.verify_linear`; "+lean" when they run the lean
    target through the native C step, `hfspec.kernels.lean_target`, cheaper still) and what
    holds most of the draft's weights ("int4", "int8", a float dtype; "" for a draft that is not a model)."""

    device: str = "cpu"
    dtype: str = "float32"
    storage: str = ""

    @classmethod
    def of(cls, target, draft, stats: SpecStats, device) -> _Prices:
        dtype = stats.target_dtype
        if dtype == "float32" and fast_linear.prepacked_bytes(target) > 0:
            dtype += "+prepack"
        elif dtype in ("float32", "bfloat16") and draft is not None and verify_linear.active_for(target):
            dtype += "+rows"
            if dtype == "float32+rows" and _lean_suffix(target, lean_target.takes(target)) == "+lean+native":
                dtype = "float32+lean"
        return cls(torch.device(device).type, dtype, _storage(draft))

    def c(self, stats: SpecStats) -> float:
        """A draft step's cost in target steps, fixed before decoding: the bytes ratio scaled for the device, the
        target's dtype and the draft's storage (`draft_step_prior`)."""
        return draft_step_prior(stats.c_bytes, self.device, self.dtype, self.storage)


def _seeded_policy(gamma, stats: SpecStats, prices: _Prices | None = None, draft=None,
                   profile: CostModel | None = None) -> GammaPolicy:
    """The γ policy of a seeded run: γ "auto" is frozen, deciding from acceptance and a cost profile fixed before
    decoding: `profile` (this pair's costs measured on this machine, `hfspec.decoding.profile`) where one was
    saved, else the bytes ratio and the verify pass's prior curve for this device, dtype and draft (`prior_model`);
    never from this run's timings, so the seed (and the saved profile) fix the text on a quiet or a busy machine
    (`hfspec.decoding.gamma`)."""
    if gamma == "auto":
        prices = prices or _Prices(dtype=stats.target_dtype)
        c = prices.c(stats)
        return AdaptiveGamma(c_prior=c, timed=False, profile=profile or prior_model(c, prices.device, prices.dtype),
                             alpha_prior=_fidelity(draft))
    return FixedGamma(int(gamma))


def _frozen_policy(target, draft_model, gamma, stats: SpecStats, prices: _Prices, sampled: bool, batch: int,
                   draft: Draft | None = None, verifier: Verifier | None = None) -> GammaPolicy:
    """A seeded decode's γ policy (`_seeded_policy`), γ "auto" priced by this pair's saved cost profile for the
    target path the decode will take (`draft`: its `Draft`, built from `draft_model` when None; `verifier`: the
    chain's when None), else by the priors."""
    profile = None
    if gamma == "auto":  # keyed by the target path the decode will take
        draft = draft if draft is not None else as_draft(draft_model)
        lean = lean_target_capable(draft, verifier or Chain()) and lean_target.takes(target, batch)
        profile = _cost_profile(target, draft_model, prices, stats, sampled, lean)
    return _seeded_policy(gamma, stats, prices, draft_model, profile)


def seeded_gamma_policy(target, draft, gamma: int | str = "auto", sampled: bool = False, batch: int = 1,
                        device=None) -> GammaPolicy:
    """A fresh copy of the γ policy a seeded chain decode (`generate(target, ids, draft=draft, gamma=gamma,
    seed=…)`, no tree, no early exit) decides with, for a batch of `batch` rows: priced by this pair's saved cost
    profile where one matches, else by the priors. Frozen, it reads only the rounds' acceptance counts, so a greedy
    run's γ choices can be replayed away from the clock (`hfspec.measure.replay`). `device`: where the prompt would
    be (default: the target's first parameter's device)."""
    validate.check_gamma(gamma)
    if draft is None:
        raise bad_value("draft", None, "a draft model or a draft spec (make_draft's), as generate takes it")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise bad_value("batch", batch, "an integer ≥ 1")
    if not isinstance(sampled, bool):
        raise bad_value("sampled", sampled, "True (T > 0) or False (greedy)")
    if device is None:
        device = next(target.parameters()).device
    draft_model = _make_draft(target, draft) if isinstance(draft, str) else draft
    stats = SpecStats(target_bytes=weight_bytes(target), draft_bytes=weight_bytes(draft_model),
                      target_dtype=model_dtype_str(target))
    return _frozen_policy(target, draft_model, gamma, stats, _Prices.of(target, draft_model, stats, device), sampled,
                          batch)


def _lean_suffix(target, lean: bool) -> str:
    """"+lean+native" where a decode that takes the lean target (`lean`) runs its passes through the native C step,
    "+lean" where through the eager lean step, "" where it does not take it."""
    decoder = lean_target.built(target)[0] if lean else None
    if decoder is None:
        return ""
    return "+lean" + ("+native" if native_step.of(decoder) is not None else "")


def profile_key(target, draft, sampled: bool, device="cpu") -> dict:
    """The key of this pair's cost profile on this machine (`hfspec.decoding.profile.profile_key`) for greedy or
    sampled rounds, from the same prices a seeded run looks its priors up by."""
    return _profile_key(target, draft, _Prices.of(target, draft, SpecStats(target_dtype=model_dtype_str(target)),
                                                  device), sampled)


def _profile_key(target, draft, prices: _Prices, sampled: bool, lean: bool | None = None) -> dict:
    """The profile key; "+lean" on the dtype where a decode's target passes take the lean target (a profile timed
    through the HF forward would price them high; "+lean+native" where those run the native C step), "step": "native" in the draft's where its steps take the native C
    step (`hfspec.kernels.native_step`; a profile of the compiled step would price them high). `lean`: whether this decode does (None: a one-row chain's)."""
    label = get_attr(draft, DRAFT_SPEC, "") if draft is not None else ""
    lean = _lean_suffix(target, lean if lean is not None else draft is not None and lean_target.takes(target))
    native = {"step": "native"} if isinstance(draft, LeanDecoder) and native_step.of(draft) is not None else {}
    return cost_profile.profile_key(target, {"spec": label or type(draft).__name__, "bytes": weight_bytes(draft)
                                             if isinstance(draft, torch.nn.Module) else 0, "storage": prices.storage,
                                             **native}, prices.dtype + lean, prices.device, sampled)


def _cost_profile(target, draft, prices: _Prices, stats: SpecStats, sampled: bool,
                  lean: bool | None = None) -> CostModel | None:
    """The saved cost profile of this pair on this machine, as a cost model (None: none matches, or profiles are
    off); `stats.cost_profile` names its file."""
    found, path = cost_profile.find(_profile_key(target, draft, prices, sampled, lean))
    if found is None:
        return None
    stats.cost_profile = path.name
    return found.model(source=f"cost profile {path.name}")


def _storage(draft) -> str:
    """What holds most of a draft model's weights ("int4", "int8" or a float dtype; "" for a draft that is not a
    model, e.g. prompt lookup): the key of its step's prior."""
    return draft_storage(draft) if isinstance(draft, torch.nn.Module) else ""


def _verifier(request: Request, stats: SpecStats, prices: _Prices) -> Verifier:
    """The run's verifier: sibling leaves (`tree` 2..8), a token tree ("auto" or a `TreeShape`), or the chain. With
    a seed, "auto" sizes the tree from priors fixed before decoding, never from this run's timings (like γ "auto")."""
    dynamic = make_tree(request.tree, request.seed is not None, prices.c(stats), prices.device, prices.dtype,
                        request.gamma == "auto")
    if dynamic is not None:
        return dynamic
    return Tree(request.tree) if isinstance(request.tree, int) and request.tree > 1 else Chain()


def weight_bytes(model) -> int:
    """Bytes of a model's weights (packed storage counted as stored; shared tensors once); 0 for no model."""
    return 0 if model is None else int(draft_weight_bytes(model))


def make_draft(target, spec, **options):
    """Build a draft for `target`: "rtn4", "rtn3-g64", "bnb-int8", a sibling folder / hub id, or a model."""
    return _make_draft(target, spec, **options)
