"""coupling="gumbel": draft-invariant sampling (`hfspec.decoding.coupling`; Daliri et al., 2024).

(1) For a seed the text is the same whatever the draft (a perturbed model, an RTN copy, prompt lookup) and γ,
and equal to a γ-free reference loop that samples the target by Gumbel-max with the same noise; (2) its law is
the target's (chi-square over 20,000 rows of one batch, each row its own noise), and two wrong couplings fail the
same test; (3) greedy decoding is unchanged; (4) bad settings are refused by name.
"""

from __future__ import annotations

import argparse

import laws
import pytest
import torch
from tiny_models import build, perturbed

import hfspec
import hfspec.decoding.chain as decoding  # the chain verifier: where the greedy rule is looked up
from hfspec.api import speculative_generate
from hfspec.cli import _coupling, build_parser
from hfspec.decoding.coupling import GumbelNoise, gumbel_noise
from hfspec.decoding.sampling import warp
from hfspec.drafts import make_draft
from hfspec.errors import HfspecError
from hfspec.session import RunSettings

PROMPTS = [[0, 5, 6, 7, 5, 6], [0, 9, 10]]
NEW = 24
SEED = 7


@pytest.fixture(scope="module")
def target():
    return build("llama", layers=2, seed=0, init=0.3)


@pytest.fixture(scope="module")
def drafts(target):
    return {"perturbed": perturbed(target, 0.5, seed=3), "rtn4": make_draft(target, "rtn4"),
            "lookup": make_draft(target, "lookup")}


def batch(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def reference(target, prompts, seed, new, **warp_kwargs):
    """γ-free Gumbel-max sampling of the target, one full forward per token: token i of row b is
    argmax(log p_i + g(seed, b, i)) with p_i the warped distribution (EOS masked, as min_new_tokens does)."""
    out = []
    for row, prompt in enumerate(prompts):
        seq = list(prompt)
        for i in range(new):
            with torch.no_grad():
                logits = target(torch.tensor([seq])).logits[:, -1]
            logits[:, laws.EOS] = -float("inf")
            log_p = warp(logits, **warp_kwargs).double().log()
            g = gumbel_noise(seed, [row], [i], log_p.shape[-1])
            seq.append(int((log_p + g).argmax(-1)))
        out.append(seq[len(prompt):])
    return torch.tensor(out)


def speculative(target, draft, gamma, seed=SEED, prompts=PROMPTS, new=NEW, **kwargs):
    ids, mask = batch(prompts)
    kwargs = {"temperature": 1.0, **kwargs}
    out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=gamma, max_new_tokens=new,
                          min_new_tokens=new, seed=seed, pad_token_id=2, coupling="gumbel", **kwargs)
    return out.sequences[:, ids.shape[1]:], out.stats


SETTINGS = [dict(temperature=1.0, top_k=0), dict(temperature=0.8, top_k=20, top_p=0.9)]  # top_k 0: off, not 50


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_same_text_whatever_the_draft_and_gamma_and_equal_to_plain_gumbel_sampling(target, drafts, settings):
    expected = reference(target, PROMPTS, SEED, NEW, **settings)
    ids, mask = batch(PROMPTS)
    plain = hfspec.plain_generate(target, ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW,
                                  seed=SEED, pad_token_id=2, coupling="gumbel", **settings)
    assert torch.equal(plain.sequences[:, ids.shape[1]:], expected)
    for name, draft in drafts.items():
        for gamma in (1, 3, 6):
            new, stats = speculative(target, draft, gamma, **settings)
            assert torch.equal(new, expected), (name, gamma)
            if name != "lookup":  # a model draft is sometimes right, sometimes not: the rule was exercised
                assert 0 < stats.accepted < stats.checked, (name, gamma)
    early, _ = speculative(target, drafts["perturbed"], "auto", early_exit=True, **settings)
    assert torch.equal(early, expected)


def test_the_seed_and_the_row_choose_the_noise(target, drafts):
    a, _ = speculative(target, drafts["rtn4"], 3, seed=1, prompts=[PROMPTS[0]] * 2)
    b, _ = speculative(target, drafts["rtn4"], 3, seed=2, prompts=[PROMPTS[0]] * 2)
    assert not torch.equal(a[0], a[1]), "two rows with the same prompt get their own noise"
    assert not torch.equal(a, b)


def test_noise_is_keyed_by_seed_row_and_position_only():
    one = gumbel_noise(5, [3], [11], 50)
    many = gumbel_noise(5, [0, 3, 3], [11, 11, 12], 50)
    assert torch.equal(one[0], many[1]) and not torch.equal(many[0], many[1]) and not torch.equal(many[1], many[2])
    grid = GumbelNoise(5).at([3, 0], [10, 11], 2, 50)
    assert grid.shape == (2, 2, 50) and grid.dtype == torch.float64
    assert torch.equal(grid[0, 1], one[0]) and torch.equal(grid[1, 0], many[0])
    g = gumbel_noise(1, list(range(200)), [0] * 200, 5000).flatten()  # Gumbel(0, 1): mean γ_E, variance π²/6
    assert abs(float(g.mean()) - 0.5772) < 0.01 and abs(float(g.var()) - torch.pi**2 / 6) < 0.02


def test_greedy_is_unchanged(target, drafts):
    ids, mask = batch(PROMPTS)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW,
                               pad_token_id=2)
    for draft in drafts.values():  # no seed needed: greedy draws nothing
        out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=3, temperature=0,
                              max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=2, coupling="gumbel")
        assert torch.equal(out.sequences, expected)


@pytest.mark.parametrize("bad", ["Gumbel", "", None, 1, "exact"])
def test_bad_coupling_is_refused_by_name(target, drafts, bad):
    ids = torch.tensor([PROMPTS[0]])
    with pytest.raises(HfspecError, match=r"coupling.*rejection.*gumbel"):
        hfspec.generate(target, ids, draft=drafts["rtn4"], temperature=1.0, seed=1, max_new_tokens=4, coupling=bad)
    with pytest.raises(HfspecError, match=r"coupling"):
        RunSettings(target="t", prompt="p", coupling=bad).validated()


def test_gumbel_needs_a_seed_and_no_tree(target, drafts):
    ids = torch.tensor([PROMPTS[0]])
    with pytest.raises(HfspecError, match=r"^seed: .*gumbel"):
        hfspec.generate(target, ids, draft=drafts["rtn4"], temperature=1.0, max_new_tokens=4, coupling="gumbel")
    with pytest.raises(HfspecError, match=r"^seed: .*gumbel"):  # the loop itself, when transformers calls it
        target.generate(ids, custom_generate=speculative_generate, draft_model=drafts["rtn4"], do_sample=True,
                        max_new_tokens=4, coupling="gumbel")
    with pytest.raises(HfspecError, match=r"^tree: .*gumbel"):
        hfspec.generate(target, ids, draft=drafts["rtn4"], temperature=1.0, seed=1, max_new_tokens=4, tree=3,
                        coupling="gumbel")
    with pytest.raises(HfspecError, match=r"^tree: .*gumbel"):
        RunSettings(target="t", prompt="p", tree="auto", coupling="gumbel").validated()


def test_settings_and_command_line_carry_the_coupling():
    settings = RunSettings(target="t", prompt="p", coupling="gumbel").validated()
    assert settings.sampling_kwargs()["coupling"] == "gumbel" == settings.generate_kwargs()["coupling"]
    assert "coupling" not in RunSettings(target="t", prompt="p").validated().sampling_kwargs()
    parser = build_parser()
    for verb in ("run", "sweep", "compare"):
        extra = ["--drafts", "rtn4"] if verb == "compare" else []
        assert parser.parse_args([verb, "--coupling", "gumbel", *extra]).coupling == "gumbel"
    with pytest.raises(argparse.ArgumentTypeError, match="coupling.*rejection.*gumbel"):
        _coupling("Gumbel")


# -------------------------------------------------------------------------------------------- the law
V, LAW_NEW, ROWS = 8, 3, 20_000


@pytest.fixture(scope="module")
def small_pair():
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16)
    draft = build("llama", vocab=V, layers=1, seed=5, init=0.6, hidden=16)
    return target, draft


def law_run(pair, prompt, **settings):
    target, draft = pair
    ids = torch.tensor([prompt] * ROWS)
    out = hfspec.generate(target, ids, draft=draft, gamma=3, max_new_tokens=LAW_NEW, min_new_tokens=LAW_NEW,
                          seed=11, pad_token_id=2, coupling="gumbel", **settings)
    return out.sequences[:, len(prompt):], out.stats


@pytest.mark.slow
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.9, top_p=0.8)],
                         ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_matches_target_law(small_pair, settings):
    prompt = [0, 3, 5]
    samples, stats = law_run(small_pair, prompt, **settings)
    assert 0.02 < stats.alpha < 0.95, "the draft must be different enough for rejections and acceptances"
    law = laws.exact_law(small_pair[0], prompt, V, LAW_NEW, **settings)
    assert laws.p_value(samples, law, V, LAW_NEW) > 1e-3


def _draft_wins(target_tokens, x):
    """A wrong coupling: every proposal kept, so the output is the draft's own Gumbel argmax."""
    gamma = x.shape[1]
    return torch.full((x.shape[0],), gamma, dtype=torch.long), target_tokens[:, gamma]


def _one_noise_for_all_rows(at):
    """A wrong coupling: every row reads row 0's noise (draws are no longer independent across rows)."""
    return lambda self, rows, starts, count, vocab, device=None: at(self, [0] * len(rows), starts, count, vocab,
                                                                    device)


@pytest.mark.slow
@pytest.mark.parametrize("wrong", ["draft-argmax-output", "noise-shared-by-rows"])
def test_negative_control_wrong_coupling_fails(small_pair, monkeypatch, wrong):
    if wrong == "draft-argmax-output":
        monkeypatch.setattr(decoding, "verify_greedy", _draft_wins)
    else:
        monkeypatch.setattr(GumbelNoise, "at", _one_noise_for_all_rows(GumbelNoise.at))
    prompt = [0, 3, 5]
    samples, _ = law_run(small_pair, prompt, temperature=1.0)
    law = laws.exact_law(small_pair[0], prompt, V, LAW_NEW, temperature=1.0)
    assert laws.p_value(samples, law, V, LAW_NEW) < 1e-6
