"""One generate call, checked once: what to decode (target, draft or plain, γ, seed, hooks) and, from
`hfspec.generate` / `plain_generate`, the keywords for `target.generate`.

Every entry point builds a `Request` first (`Request.for_generate`, or `Request.for_loop` when transformers
calls `speculative_generate` directly); nothing downstream checks the same things again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from hfspec import validate
from hfspec.decoding.coupling import check_coupling
from hfspec.decoding.options import check_generate_kwargs
from hfspec.decoding.tree_shape import TreeShape
from hfspec.kernels.cache import has_sliding_layers
from hfspec.validate import TREE_MAX

__all__ = ["Hooks", "Request", "Sampling", "Speculation", "TREE_MAX", "check_coupling_seed", "check_tree"]

_DRAFT_ALLOWED = "a draft model (hfspec.make_draft(target, 'rtn4'), or a sibling)"


@dataclass(frozen=True)
class Speculation:
    """How the draft proposes: γ (or "auto"), the tree, the early exit and the coupling."""

    gamma: int | str = 4
    tree: object = 0  # 0 or 1: the chain; 2..8: sibling leaves; "auto" or a TreeShape: a token tree
    early_exit: bool = False
    coupling: str = "rejection"


@dataclass(frozen=True)
class Sampling:
    """hfspec.generate's sampling arguments (None: the model's generation config)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Hooks:
    """Callbacks of a run: `on_round` after every round, `should_stop()` polled to end it early."""

    on_round: Callable | None = None
    should_stop: Callable[[], bool] | None = None


NO_HOOKS = Hooks()


@dataclass(frozen=True)
class Request:
    """A validated request. `draft` is the draft model (None when `plain`); `draft_vocab` its usable
    vocabulary width from `validate.check_pair` (None: all of it)."""

    target: object
    draft: object
    gamma: int | str
    plain: bool = False
    seed: int | None = None
    on_round: Callable | None = None
    should_stop: Callable[[], bool] | None = None
    draft_vocab: int | None = None
    tree: object = 0  # 0 or 1: the chain; 2..8: sibling leaves (hfspec.decoding.siblings); "auto" or a TreeShape: a token tree
    # From hfspec.generate / plain_generate only:
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    max_new_tokens: int | None = None
    generate_kwargs: dict = field(default_factory=dict)
    early_exit: bool = False  # the draft may end a round early (`hfspec.decoding.early_exit`)
    coupling: str = "rejection"  # or "gumbel": draft-invariant sampling (`hfspec.decoding.coupling`)

    @classmethod
    def for_loop(cls, target, input_ids, draft, how: Speculation, *, plain=False, seed=None, hooks: Hooks = NO_HOOKS,
                 draft_field: str = "draft_model") -> Request:
        """The checks the decoding loop relies on: seed, γ, a draft that shares the target's tokens, position
        ids for batches, and a coupling the other options keep (the seed it needs is checked once the loop knows
        whether it samples: `check_coupling_seed`)."""
        validate.check_seed(seed)
        check_coupling(how.coupling)
        validate.check_flag("early_exit", how.early_exit)
        vocab = None
        if not plain:
            validate.check_gamma(how.gamma)
            if draft is None:
                raise validate.bad_value(draft_field, None, _DRAFT_ALLOWED)
            vocab = validate.check_pair(target, draft)
        else:
            draft = None
        if input_ids.shape[0] > 1 and not validate.accepts_positions(target, draft):
            raise validate.bad_value("input_ids", tuple(input_ids.shape), "batch size 1 for models without position_ids")
        check_tree(how.tree, plain, input_ids, target)
        validate.check_tree_coupling(how.tree, how.coupling)
        return cls(target, draft, how.gamma, plain, seed, hooks.on_round, hooks.should_stop, vocab,
                   early_exit=how.early_exit and not plain, tree=how.tree, coupling=how.coupling)

    @classmethod
    def for_generate(cls, target, input_ids, draft, how: Speculation, *, plain: bool, sampling: Sampling,
                     attention_mask=None, hooks: Hooks = NO_HOOKS, generation_kwargs: dict | None = None) -> Request:
        """`hfspec.generate` / `plain_generate`'s arguments, checked before any model runs."""
        s = sampling
        validate.check_sampling(s.temperature, s.top_k, s.top_p, (generation_kwargs or {}).get("min_p"),
                                s.max_new_tokens)
        kwargs = check_generate_kwargs(input_ids, s.temperature, generation_kwargs or {})
        how = replace(how, tree=kwargs.pop("tree", how.tree))  # from plain_generate's **generation_kwargs: never passed on
        validate.check_input_ids(input_ids, attention_mask)
        request = replace(
            cls.for_loop(target, input_ids, draft, how, plain=plain, seed=s.seed, hooks=hooks, draft_field="draft"),
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=s.max_new_tokens,
            generate_kwargs=_sampling_kwargs(kwargs, s.temperature, s.top_k, s.top_p, s.max_new_tokens))
        check_coupling_seed(how.coupling, s.seed, bool(s.temperature))  # temperature None: checked by the loop
        validate.check_length(target, input_ids.shape[1], s.max_new_tokens)
        return request

    @property
    def shown_gamma(self) -> int | str:
        """γ as statistics report it (0 for plain decoding)."""
        return 0 if self.plain else self.gamma


def check_coupling_seed(coupling: str, seed, do_sample: bool) -> None:
    """coupling="gumbel" keys its noise by the seed: sampling without one is refused (greedy needs none)."""
    if coupling == "gumbel" and do_sample and seed is None:
        raise validate.bad_value("seed", None, 'an integer with coupling="gumbel" (its noise is keyed by the seed, '
                                 "the batch row and the position; the seed alone fixes the text)")


def check_tree(tree, plain: bool, input_ids: torch.Tensor, target=None) -> None:
    """`tree`: 0 or 1 (the plain chain), 2..TREE_MAX candidates per unsure position, "auto" or a
    `hfspec.decoding.tree_shape.TreeShape` (a token tree); any tree runs batch size 1 on a full-attention target."""
    validate.check_tree(tree, (TreeShape,))
    if not validate.is_tree(tree):
        return
    if plain:
        raise validate.bad_value("tree", tree, "0 or 1 for plain decoding (a tree needs a draft)")
    if input_ids.shape[0] > 1:
        raise validate.bad_value("tree", tree, "0 or 1 for batches (tree speculation runs batch size 1)")
    if target is not None:
        if has_sliding_layers(target):
            raise validate.bad_value("tree", tree, "0 or 1 for targets with sliding-window attention layers "
                                     "(a tree needs full attention in every layer)")


def _sampling_kwargs(kwargs: dict, temperature, top_k, top_p, max_new_tokens) -> dict:
    """`target.generate` keywords for hfspec's sampling arguments (temperature 0 is greedy)."""
    kwargs = dict(kwargs)
    if temperature is not None:
        if temperature == 0:
            kwargs.setdefault("do_sample", False)
        else:
            kwargs.setdefault("do_sample", True)
            kwargs["temperature"] = float(temperature)
    if kwargs.get("do_sample") is False:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    else:
        if top_k is not None:
            kwargs["top_k"] = top_k
        if top_p is not None:
            kwargs["top_p"] = top_p
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    return kwargs
