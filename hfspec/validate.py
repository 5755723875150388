"""Checks of user input, made before any model runs. Each error names the field and what is allowed; each field
has one check, which every front end calls."""

from __future__ import annotations

import math
import numbers

import torch

from hfspec import attrs
from hfspec.errors import HfspecError, bad_value
from hfspec.kernels.cache import accepts

GAMMA_MAX = 64  # the largest fixed γ a user may ask for
AUTO_GAMMA_MAX = 16  # the largest γ that gamma="auto" (AdaptiveGamma, stats.optimal_gamma) considers
TREE_MAX = 8  # the most sibling candidates per unsure draft position (hfspec.decoding.siblings)

# Every field a user sets is checked by one function here; the CLI, the dashboard, presets (through `RunSettings`)
# and the API call it, so a field's range and its message live in one place.


def check_gamma(gamma, fixed: str = "") -> None:
    """γ: an integer from 1 to GAMMA_MAX or "auto"; `fixed` (why a fixed γ is needed) refuses "auto"."""
    if gamma == "auto" and not fixed:
        return
    if gamma == "auto" or isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= GAMMA_MAX:
        allowed = f"an integer from 1 to {GAMMA_MAX} ({fixed})" if fixed else f'an integer from 1 to {GAMMA_MAX}, or "auto"'
        raise bad_value("gamma", gamma, allowed)


def check_gammas(gammas, field: str = "gammas", auto: bool = True) -> None:
    """A list of γ for a sweep: not empty, each from 1 to GAMMA_MAX (or "auto" where `auto`)."""
    allowed = f"integers from 1 to {GAMMA_MAX}" + (' or "auto"' if auto else "")
    if not gammas:
        raise bad_value(field, gammas, allowed)
    for g in gammas:
        if not (auto and g == "auto") and (isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= GAMMA_MAX):
            raise bad_value(field, g, allowed)


def check_count(field: str, value, minimum: int) -> None:
    """An integer >= `minimum` (max_new_tokens, repeats, tokens, samples, threads)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_value(field, value, f"an integer >= {minimum}")


def check_flag(field: str, value) -> None:
    if not isinstance(value, bool):
        raise bad_value(field, value, "True or False")


def check_temperature(temperature) -> None:
    if not _is_number(temperature) or not 0 <= temperature < math.inf:
        raise bad_value("temperature", temperature, "a finite number >= 0 (0 means greedy)")


def check_top_k(top_k) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise bad_value("top_k", top_k, "an integer >= 0 (0 turns it off; None keeps the model's generation config, "
                        "where transformers' default is 50)")


def check_top_p(top_p) -> None:
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise bad_value("top_p", top_p, "a number in (0, 1]")


def check_min_p(min_p) -> None:
    if not _is_number(min_p) or not 0 <= min_p <= 1:
        raise bad_value("min_p", min_p, "a number in [0, 1]")


def check_sampling(temperature=None, top_k=None, top_p=None, min_p=None, max_new_tokens=None) -> None:
    """The sampling arguments of the API, each checked when given (None: the model's generation config)."""
    for value, check in ((temperature, check_temperature), (top_k, check_top_k), (top_p, check_top_p),
                         (min_p, check_min_p)):
        if value is not None:
            check(value)
    if max_new_tokens is not None:
        check_count("max_new_tokens", max_new_tokens, 0)


def check_seed(seed, *, optional: bool = True, unsigned: bool = False, bits: int = 64) -> None:
    """An integer torch.Generator.manual_seed takes (1.5 would silently become 1, "abc" fail later): from -2**63
    (0 when `unsigned`) to 2**bits - 1; None when `optional`."""
    if seed is None and optional:
        return
    low, low_text = (0, "0") if unsigned else (-(2**63), "-2**63")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not low <= seed < 2**bits:
        allowed = f"an integer from {low_text} to 2**{bits} - 1" + (", or None" if optional else "")
        raise bad_value("seed", seed, allowed)


TREE_ALLOWED = f"an integer from 0 to {TREE_MAX} (0 or 1: no tree)"


def check_tree(tree, shapes: tuple[type, ...] = ()) -> None:
    """`tree`: 0 or 1 (the plain chain), 2..TREE_MAX sibling candidates, "auto", or (the API) one of `shapes`."""
    dynamic = tree == "auto" if isinstance(tree, str) else isinstance(tree, shapes)
    if dynamic:
        return
    if isinstance(tree, bool) or not isinstance(tree, int) or not 0 <= tree <= TREE_MAX:
        raise bad_value("tree", tree, TREE_ALLOWED + (', "auto" or an hfspec.TreeShape' if shapes else ' or "auto"'))


def is_tree(tree) -> bool:
    """True for a tree setting that is not the plain chain (2..8 siblings, "auto" or a TreeShape)."""
    return not (isinstance(tree, int) and not isinstance(tree, bool) and tree <= 1)


def check_tree_coupling(tree, coupling: str) -> None:
    """coupling="gumbel" runs the chain only."""
    if coupling == "gumbel" and is_tree(tree):
        raise bad_value("tree", tree, '0 or 1 with coupling="gumbel" (tree speculation keeps the law by '
                        "recursive rejection, not the draft-invariant text)")


def check_input_ids(input_ids, attention_mask=None) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise bad_value("input_ids", type(input_ids).__name__, "a LongTensor of token ids, shape [batch, length]")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise bad_value("input_ids", tuple(input_ids.shape), "shape [batch, length] with batch, length >= 1")
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise bad_value("attention_mask", tuple(attention_mask.shape), f"the shape of input_ids, {tuple(input_ids.shape)}")
    if attention_mask is not None and bool((attention_mask == 0).all(dim=1).any()):
        row = int((attention_mask == 0).all(dim=1).nonzero()[0, 0])
        raise bad_value("attention_mask", f"row {row} all padding", "at least one real token (mask 1) in every row")
    if attention_mask is not None and input_ids.shape[0] > 1 and bool((attention_mask[:, -1] == 0).any()):
        raise HfspecError("attention_mask: right padding found; pad batches on the left (tokenizer.padding_side='left')")


def check_token_ids(input_ids: torch.Tensor, *models) -> None:
    """Every token id must index each model's input embedding (else a raw IndexError deep in the forward)."""
    rows = [_embedding_rows(m) for m in models if m is not None]
    limit = min((r for r in rows if r is not None), default=None)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or (limit is not None and high >= limit):
        bad = low if low < 0 else high
        where = tuple(int(i) for i in (input_ids == bad).nonzero()[0])
        allowed = f"ids from 0 to {limit - 1} (the models' vocabulary)" if limit else "ids >= 0"
        raise bad_value("input_ids", f"token id {bad} at {where}", allowed)


def _embedding_rows(model) -> int | None:
    """Rows of a model's input embedding (nn.Embedding and hfspec's packed QuantEmbedding); None if unknown."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embed, "num_embeddings", None)
    return int(rows) if isinstance(rows, int) else None


def vocab_size(model) -> int:
    """Width of the model's output distribution."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None) if head is not None else None
    if weight is not None and weight.dim() == 2:
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def eos_ids(model) -> list[int]:
    """The token ids that end a text: the generation config's `eos_token_id`, else the model config's ([] if none)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])]


def check_pair(target, draft) -> int | None:
    """Draft and target must share token ids. Returns the draft's usable vocabulary width (None: all of it).

    A draft from `make_draft` carries its shared vocabulary (`hfspec.attrs.SHARED_VOCAB`) after its tokenizer check; then extra padded rows
    on either side are fine (draft rows beyond it are masked, target rows beyond the draft get q = 0).
    """
    if draft is None:
        return None
    if draft is target:
        raise HfspecError("draft: the draft is the target itself; pass a quantised copy (make_draft) or a sibling")
    shared = attrs.get_attr(draft, attrs.SHARED_VOCAB)
    v_target, v_draft = vocab_size(target), vocab_size(draft)
    if shared is not None:
        if not 0 < int(shared) <= min(v_target, v_draft):
            raise HfspecError(
                f"draft: its shared vocabulary {shared} does not fit the target's {v_target} and the draft's "
                f"{v_draft} vocabulary rows; allowed: a draft checked against this target (hfspec.make_draft)"
            )
        return int(shared)
    if v_target != v_draft:
        raise HfspecError(
            f"draft: vocabulary size {v_draft} differs from the target's {v_target}; the draft must share the "
            "target's tokenizer (build it with hfspec.make_draft, which checks the tokenizers)"
        )
    return None


def check_length(target, prompt_len: int, max_new_tokens: int | None) -> None:
    config = target.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit and max_new_tokens is not None and prompt_len + max_new_tokens > limit:
        raise HfspecError(
            f"max_new_tokens: prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) = "
            f"{prompt_len + max_new_tokens} exceeds the target's {limit} positions; allowed: max_new_tokens <= "
            f"{max(0, limit - prompt_len)}"
        )


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def accepts_positions(*models) -> bool:
    """Batches with ragged acceptance need explicit position ids in every model."""
    return all(model is None or accepts(model, "position_ids") for model in models)
