"""Prompt lookup (`make_draft(target, "lookup")`): spec grammar, the n-gram search, exact output at T = 0 and
in distribution at T = 1 (with negative controls), batches with left padding, and the registry entry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from laws import WRONG_RULES, exact_law, p_value
from tiny_models import build

import hfspec
import hfspec.decoding.sampling as sampling
from hfspec.attrs import DRAFT_SPEC, get_attr
from hfspec.drafts import describe, make_draft, registry, weight_bytes
from hfspec.drafts.lookup import propose_tokens
from hfspec.errors import HfspecError

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"


# ------------------------------------------------------------------------------------------ spec and registry
@pytest.mark.parametrize("text, label, ngram", [
    ("lookup", "lookup-n3", 3), ("LOOKUP-N5", "lookup-n5", 5), ("lookup-n1", "lookup-n1", 1),
    (" lookup-n8 ", "lookup-n8", 8),
])
def test_spec_parses_and_labels(text, label, ngram):
    spec = registry.parse(text)
    assert (spec.kind, spec.label, spec.param("ngram")) == ("lookup", label, ngram)


@pytest.mark.parametrize("text, why", [("lookup-n0", "1..8, got 0"), ("lookup-n9", "1..8, got 9"),
                                       ("lookup-x", "cannot read"), ("lookupn3", "cannot read"),
                                       ("lookup-n", "cannot read")])
def test_bad_spec_names_allowed_values(text, why):
    with pytest.raises(HfspecError, match="allowed specs") as err:
        registry.parse(text)
    assert why in str(err.value) and "lookup-n1..lookup-n8" in str(err.value)


def test_registry_lists_it_and_form_values_round_trip():
    names = [k.name for k in registry.choices()]
    assert "lookup" in names and names[-1] == "sibling"
    kind = registry.KINDS["lookup"]
    (field,) = kind.fields
    assert (field.name, field.default, field.low, field.high) == ("ngram", 3, 1, 8)
    assert registry.spec_of("lookup", {"ngram": 2}) == "lookup-n2"
    assert registry.spec_of("lookup", {"ngram": 3}) == "lookup"
    values = registry.fields_of("lookup-n2")
    assert (values["kind"], values["ngram"]) == ("lookup", 2)
    assert registry.spec_of(values["kind"], values) == "lookup-n2"
    assert registry.fields_of("lookup")["ngram"] == 3
    for bad in (12, 0, "two"):
        with pytest.raises(HfspecError, match="1..8"):
            registry.spec_of("lookup", {"ngram": bad})


def test_draft_model_holds_no_weights_and_refuses_options():
    target = build("llama")
    draft = make_draft(target, "lookup-n2")
    assert weight_bytes(draft) == 0 and draft.config.vocab_size == target.config.vocab_size
    assert get_attr(draft, DRAFT_SPEC) == "lookup-n2" and "lookup" in describe(draft)["step"]
    with pytest.raises(HfspecError, match="none"):
        make_draft(target, "lookup", fused=True)
    with pytest.raises(HfspecError, match="draft"):
        draft(input_ids=torch.tensor([[0, 3]]))  # no logits: a clear error, not a crash deep inside


# ------------------------------------------------------------------------------------------ the search
def proposals(rows, gamma=4, ngram=3, valid=None):
    tokens = torch.tensor(rows)
    mask = None if valid is None else torch.tensor(valid).bool()
    return propose_tokens(tokens, mask, gamma, ngram).tolist()


def test_search_prefers_longest_then_most_recent_match():
    # suffix "1 2": the 2-gram occurs at slots 0-1 (then 7); "2" alone more recently (then 9): the 2-gram wins
    assert proposals([[1, 2, 7, 5, 2, 9, 3, 1, 2]]) == [[7, 5, 2, 9]]
    # with n = 1 only the last token counts: its most recent earlier occurrence (slot 4, then 9)
    assert proposals([[1, 2, 7, 5, 2, 9, 3, 1, 2]], ngram=1) == [[9, 3, 1, 2]]
    # two equal 2-gram matches: the most recent
    assert proposals([[4, 5, 6, 4, 5, 8, 0, 4, 5]], gamma=2) == [[8, 0]]


def test_copy_near_the_end_repeats_periodically():
    assert proposals([[3, 5, 6, 5, 6]], gamma=5) == [[5, 6, 5, 6, 5]]
    assert proposals([[7, 7]], gamma=3) == [[7, 7, 7]]


def test_no_match_proposes_nothing_and_batch_rows_without_one_repeat_their_last_token():
    assert proposals([[1, 2, 3, 4]]) == [[]]
    assert proposals([[0]]) == [[]]
    assert proposals([[1, 2, 3, 4], [5, 6, 5, 8]], gamma=3) == [[], []]
    assert proposals([[1, 2, 3, 4], [5, 6, 8, 6]], gamma=3) == [[4, 4, 4], [8, 6, 8]]


def test_invalid_slots_never_match():
    # row 0: slots 0-1 are left padding that would give the 2-gram "9 6" a match; row 1 has a hole at slot 4,
    # without which the continuation of its last "3" would be "4 3 ..."
    rows = [[9, 6, 7, 5, 9, 6], [3, 4, 9, 3, 4, 3]]
    valid = [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1]]
    assert proposals(rows, valid=valid) == [[6, 6, 6, 6], [3, 3, 3, 3]]
    assert proposals(rows) == [[7, 5, 9, 6], [4, 3, 4, 3]]
    assert proposals([[6, 5, 9, 5, 6]], valid=[[0, 1, 1, 1, 1]]) == [[]]  # the 6 at slot 0 is padding
    assert proposals([[6, 5, 9, 5, 6]]) == [[5, 9, 5, 6]]  # ... and would match if it were not


# ------------------------------------------------------------------------------------------ exact decoding
def test_greedy_identical_on_a_tiny_model():
    target = build("llama", init=0.2)
    ids = torch.tensor([[0, 5, 17, 33, 9, 4, 5, 17, 33, 9]])
    plain = hfspec.plain_generate(target, ids, temperature=0, max_new_tokens=48, min_new_tokens=48)
    for spec in ("lookup", "lookup-n1"):
        out = hfspec.generate(target, ids, draft=make_draft(target, spec), gamma=4, temperature=0,
                              max_new_tokens=48, min_new_tokens=48)
        assert torch.equal(out.sequences, plain.sequences), spec
        s = out.stats
        assert s.accepted > 0 and s.target_passes < 48
        assert s.draft_forwards == 0 and s.time_draft == 0 and s.c_time == 0 and s.paper_speedup == 0
        assert s.predicted_speedup > 0  # the cost model prices lookup's rounds (no draft forward, varying γ)


@pytest.fixture(scope="module")
def micro():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(MICRO, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(MICRO, local_files_only=True)


def test_greedy_identical_on_the_micro_model_with_accepted_copies(micro):
    model, tokenizer = micro
    doc = 'def get(self, key):\n    """Return the value for key if key is in the dictionary, else default."""'
    doc += "\n"
    ids = tokenizer(doc * 3 + "def get(self, key):\n", return_tensors="pt").input_ids
    plain = hfspec.plain_generate(model, ids, temperature=0, max_new_tokens=32, min_new_tokens=32)
    out = hfspec.generate(model, ids, draft=make_draft(model, "lookup"), gamma=4, temperature=0,
                          max_new_tokens=32, min_new_tokens=32)
    assert torch.equal(out.sequences, plain.sequences)
    assert out.stats.accepted > 0 and out.stats.target_passes < 32


def test_batch_with_left_padding_equals_plain_greedy():
    target = build("llama", init=0.2)
    prompts = [[0, 5, 17, 33, 9, 4, 5, 17, 33], [0, 7, 12]]
    width = max(map(len, prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(attention_mask=mask, temperature=0, max_new_tokens=40, min_new_tokens=40, pad_token_id=2)
    plain = hfspec.plain_generate(target, ids, **kwargs)
    out = hfspec.generate(target, ids, draft=make_draft(target, "lookup"), gamma=3, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    assert out.stats.accepted > 0 and out.stats.new_tokens_per_row == [40, 40]


# ------------------------------------------------------------------------------------------ exact sampling
V, NEW, ROWS = 8, 3, 12_000
PROMPTS = [[0, 3, 5, 3], [0, 6, 1, 4, 7]]  # the first matches at once (proposes 5 3 5 ...), the second not


@pytest.fixture(scope="module")
def small():
    return build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16)


def sample_rows(target, seed):
    width = max(map(len, PROMPTS))
    rows = [PROMPTS[i % len(PROMPTS)] for i in range(ROWS)]
    ids = torch.tensor([[2] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    out = hfspec.generate(target, ids, attention_mask=mask, draft=make_draft(target, "lookup"), gamma=3,
                          temperature=1.0, max_new_tokens=NEW, min_new_tokens=NEW, seed=seed, pad_token_id=2)
    new = out.sequences[:, width:]
    return [new[i :: len(PROMPTS)] for i in range(len(PROMPTS))], out.stats


@pytest.mark.slow
def test_sampling_matches_the_target_law(small):
    groups, stats = sample_rows(small, seed=3)
    assert 0.05 < stats.alpha < 0.95, "proposals must be both accepted and rejected for the test to mean much"
    for prompt, samples in zip(PROMPTS, groups, strict=True):
        assert p_value(samples, exact_law(small, prompt, V, NEW, temperature=1.0), V, NEW) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule", list(WRONG_RULES))
def test_negative_control_wrong_rule_fails(small, monkeypatch, rule):
    name, wrong = WRONG_RULES[rule]
    monkeypatch.setattr(sampling, name, wrong)
    groups, _ = sample_rows(small, seed=3)
    expected = [exact_law(small, prompt, V, NEW, temperature=1.0) for prompt in PROMPTS]
    assert min(p_value(s, law, V, NEW) for s, law in zip(groups, expected, strict=True)) < 1e-6
