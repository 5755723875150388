"""Siblings whose vocabulary rows differ from the target's (padding) decode exactly; tokenizer mismatches fail.

The tokenizer has V = 8 tokens; the target has 8 rows and the sibling 16 (8 padded rows, random logits). The
tokenizer check in `make_draft` marks the draft (`hfspec.attrs.SHARED_VOCAB`), so `generate` accepts it. At T = 0 the
output equals plain greedy; at T = 1 the joint law of two new tokens over 20,000 seeded rows matches the
target's exact law (chi-square), and a deliberately wrong acceptance rule fails the same test.
"""

import laws
import pytest
import torch
from laws import WRONG_RULES
from tiny_models import build
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

import hfspec
import hfspec.decoding.sampling as sampling
from hfspec.attrs import SHARED_VOCAB, get_attr
from hfspec.errors import HfspecError

V, PADDED, NEW, ROWS = 8, 16, 2, 20_000
PROMPT = [0, 3, 5]


def tokenizer(names: list[str]) -> PreTrainedTokenizerFast:
    vocab = {name: i for i, name in enumerate(names)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=names[2])))


TOKENS = ["<s>", "</s>", "<pad>"] + [f"t{i}" for i in range(3, V)]


@pytest.fixture(scope="module")
def pair():
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16)
    sibling = build("llama", vocab=PADDED, layers=1, seed=5, init=0.6, hidden=16)
    tok = tokenizer(TOKENS)
    draft = hfspec.make_draft(target, sibling, target_tokenizer=tok, draft_tokenizer=tok)
    return target, draft


def test_padded_rows_are_proposable_without_the_mark(pair):
    """Precondition: the sibling's padded rows win its argmax somewhere, so they matter."""
    _, draft = pair
    ids = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (draft(ids).logits.argmax(-1) >= V).any()
    assert get_attr(draft, SHARED_VOCAB) == V


def test_unmarked_padded_sibling_is_refused(pair):
    target, _ = pair
    sibling = build("llama", vocab=PADDED, layers=1, seed=5, init=0.6, hidden=16)
    with pytest.raises(HfspecError, match="vocabulary size 16 differs"):
        hfspec.generate(target, torch.tensor([PROMPT]), draft=sibling, temperature=0, max_new_tokens=4)
    with pytest.raises(HfspecError, match="target_tokenizer"):
        hfspec.make_draft(target, sibling)  # rows differ and no tokenizers to check them


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_equals_plain(pair, gamma):
    target, draft = pair
    ids = torch.tensor([PROMPT, [0, 7, 6]])
    spec = hfspec.generate(target, ids, draft=draft, gamma=gamma, temperature=0, max_new_tokens=24,
                           min_new_tokens=24)
    plain = hfspec.plain_generate(target, ids, temperature=0, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.checked > 0 and int(spec.sequences.max()) < V


def test_padded_target_greedy_equals_plain():
    """The other side padded: the target has 12 rows (padded rows never win its argmax here), the draft 8."""
    target = build("llama", vocab=12, layers=1, seed=0, init=0.6, hidden=16)
    with torch.no_grad():
        target.lm_head.weight[V:] = 0  # padded rows: logit 0, below the peaky real tokens' best
    draft = build("llama", vocab=V, layers=1, seed=5, init=0.6, hidden=16)
    tok = tokenizer(TOKENS)
    draft = hfspec.make_draft(target, draft, target_tokenizer=tok, draft_tokenizer=tok)
    ids = torch.tensor([PROMPT])
    plain = hfspec.plain_generate(target, ids, temperature=0, max_new_tokens=24, min_new_tokens=24)
    assert int(plain.sequences.max()) < V  # precondition: the target itself never writes a padded id
    spec = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=0, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(spec.sequences, plain.sequences)


def test_padded_target_sampling_runs():
    """At T = 1 a padded target can write a padded id (a trained one rarely, this random one often)."""
    target = build("llama", vocab=12, layers=1, seed=0, init=0.6, hidden=16)
    draft = build("llama", vocab=V, layers=1, seed=5, init=0.6, hidden=16)
    tok = tokenizer(TOKENS)
    draft = hfspec.make_draft(target, draft, target_tokenizer=tok, draft_tokenizer=tok)
    out = hfspec.generate(target, torch.tensor([PROMPT] * 64), draft=draft, gamma=3, temperature=1.0,
                          max_new_tokens=8, seed=1)
    assert int(out.sequences.max()) >= V  # the padded ids were written, and decoding went on


def test_tokenizer_mismatch_is_a_clear_error(pair):
    target, _ = pair
    sibling = build("llama", vocab=PADDED, layers=1, seed=5, init=0.6, hidden=16)
    other = tokenizer(TOKENS[:5] + ["x5"] + TOKENS[6:])
    with pytest.raises(HfspecError, match=r"differs from the target's at id 5 \('x5' vs 't5'\)"):
        hfspec.make_draft(target, sibling, target_tokenizer=tokenizer(TOKENS), draft_tokenizer=other)
    shorter = tokenizer(TOKENS[:6])
    with pytest.raises(HfspecError, match="tokenizer has 6 tokens but the target's has 8"):
        hfspec.make_draft(target, sibling, target_tokenizer=tokenizer(TOKENS), draft_tokenizer=shorter)


def exact_law(target) -> dict[tuple, float]:
    return laws.exact_law(target, PROMPT, V, NEW)


def p_value(samples: torch.Tensor, law: dict[tuple, float]) -> float:
    return laws.p_value(samples, law, V, NEW)


def sample(target, draft) -> tuple[torch.Tensor, hfspec.SpecStats]:
    ids = torch.tensor([PROMPT] * ROWS)
    out = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=1.0, max_new_tokens=NEW,
                          min_new_tokens=NEW, seed=3)
    return out.sequences[:, len(PROMPT):], out.stats


@pytest.mark.slow
def test_distribution_matches_target(pair):
    target, draft = pair
    samples, stats = sample(target, draft)
    assert 0.05 < stats.alpha < 0.95, "the sibling must be different enough for rejections and acceptances"
    assert p_value(samples, exact_law(target)) > 1e-3


@pytest.mark.slow
def test_negative_control_always_accept_fails(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(sampling, *WRONG_RULES["always-accept"])
    samples, _ = sample(target, draft)
    assert p_value(samples, exact_law(target)) < 1e-6
