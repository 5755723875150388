"""Large-vocabulary work outside the forwards: the faster forms give the same results as the plain ones, and
no vocabulary-wide copies that are not needed (checked by the ops' output sizes, never by timing)."""

import pytest
import torch
from scipy.stats import chisquare
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.generation import logits_process as lp

from hfspec.decoding.sampling import first_argmax, kth_largest, sample, verify
from hfspec.decoding.scoring import Scorer, _FastTopK

NEG = -float("inf")


class Outputs(TorchDispatchMode):
    """Records (op name, dtype, numel) of every new tensor (not a view) an op returns."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:  # views share storage
                self.seen.append((str(func), t.dtype, t.numel()))
        return out


def test_two_level_sample_draws_the_same_tokens_as_one_cdf():
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.3, 0.0, 0.4]]).expand(20000, 11)
    ragged = sample(probs, torch.Generator().manual_seed(4), block=4, single_up_to=0)  # blocks of 4, a tail of 3
    whole = sample(probs, torch.Generator().manual_seed(4), block=11, single_up_to=0)  # one block
    single = sample(probs, torch.Generator().manual_seed(4))  # a small vocabulary: one float64 CDF
    assert torch.equal(ragged, whole) and torch.equal(ragged, single)
    counts = torch.bincount(ragged, minlength=11)
    assert counts[[0, 2, 3, 4, 5, 6, 9]].sum() == 0  # zero mass, including a block with none at all
    expected = (probs[0, [1, 7, 8, 10]] * 20000).numpy()
    assert chisquare(counts[[1, 7, 8, 10]].numpy(), expected).pvalue > 1e-3
    swapped = probs[:, [0, 7, 2, 3, 4, 5, 6, 1, 8, 9, 10]]  # tokens 1 and 7 trade mass: a wrong law must fail
    wrong = torch.bincount(sample(swapped, torch.Generator().manual_seed(4), block=4, single_up_to=0), minlength=11)
    assert chisquare(wrong[[1, 7, 8, 10]].numpy(), expected).pvalue < 1e-6


def test_one_and_two_level_sample_agree_on_a_real_sized_vocabulary():
    probs = torch.rand(4000, 2048, generator=torch.Generator().manual_seed(1)).pow(8).softmax(-1)
    one = sample(probs, torch.Generator().manual_seed(5))
    two = sample(probs, torch.Generator().manual_seed(5), single_up_to=0)
    assert (one != two).sum() <= 1  # only a u within float64 rounding of a CDF step may land apart


def test_sample_makes_no_vocabulary_wide_float64_copy():
    vocab = 65536
    probs = torch.rand(2, vocab).softmax(-1)
    with Outputs() as ops:
        sample(probs, torch.Generator().manual_seed(0))
    assert max(n for _, dtype, n in ops.seen if dtype == torch.float64) <= 2 * 1024


@pytest.mark.parametrize("vocab", [5000, 8192])
def test_first_argmax_is_torch_argmax(vocab):
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(3, 2, vocab, generator=g), torch.randn(3, 2, vocab, generator=g).round(),  # many ties
             torch.full((2, vocab), NEG), torch.zeros(2, vocab)]
    cases[2][0, -1] = 1.0
    nan = torch.randn(2, vocab, generator=g)
    nan[1, vocab // 2] = float("nan")
    for scores in [*cases, nan]:
        assert torch.equal(first_argmax(scores), scores.argmax(-1))


@pytest.mark.parametrize("vocab, k", [(3000, 5), (2560, 5), (6000, 1), (600, 5)])
def test_top_k_equals_transformers_warper(vocab, k):
    g = torch.Generator().manual_seed(1)
    rounded = torch.randn(3, vocab, generator=g).round()  # ties at the k-th value
    sparse = torch.randn(3, vocab, generator=g)
    sparse[:, : vocab // 2] = NEG
    nan = torch.randn(3, vocab, generator=g)
    nan[0, 3] = float("nan")
    for scores in (torch.randn(3, vocab, generator=g) * 3, rounded, sparse, nan):
        assert torch.equal(kth_largest(scores, k).nan_to_num(), torch.topk(scores, k).values[:, -1:].nan_to_num())
        ours = _FastTopK.of(lp.TopKLogitsWarper(k))(None, scores.clone())
        theirs = lp.TopKLogitsWarper(k)(None, scores.clone())
        assert torch.equal(ours.nan_to_num(), theirs.nan_to_num()) and torch.equal(ours.isnan(), theirs.isnan())


def test_length_processors_match_transformers_position_by_position():
    vocab = 50
    procs = [lp.MinNewTokensLengthLogitsProcessor(4, 6, [1, 7, 99]), lp.RepetitionPenaltyLogitsProcessor(1.5),
             lp.MinLengthLogitsProcessor(9, 3), lp.TemperatureLogitsWarper(0.7)]
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, vocab, generator=g)
    extra = torch.randint(0, vocab, (3, 3), generator=g)
    history = [(torch.tensor([0, 2]), torch.randint(0, vocab, (2, 5), generator=g)),
               (torch.tensor([1]), torch.randint(0, vocab, (1, 8), generator=g))]
    expected = torch.empty_like(logits)
    for rows, ids in history:
        for j in range(4):
            context = torch.cat([ids, extra[rows, :j]], dim=1)
            expected[rows, j] = lp.LogitsProcessorList(procs)(context, logits[rows, j].clone())
    with Outputs() as ops:
        got = Scorer(procs, True, vocab).scores(history, extra, logits)
    assert torch.equal(got, expected)
    assert not [name for name, *_ in ops.seen if "isin" in name]
    assert bool((got[:, :, 1] == NEG).any()) and bool((got[:, :, 1] > NEG).any())  # both sides of the limits


def test_length_processors_while_every_position_is_short_take_one_op_and_match_transformers():
    vocab = 50
    procs = [lp.MinNewTokensLengthLogitsProcessor(4, 20, [1, 7, 99]), lp.MinLengthLogitsProcessor(30, 3),
             lp.TemperatureLogitsWarper(0.7)]
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, vocab, generator=g)
    extra = torch.randint(0, vocab, (3, 3), generator=g)
    history = [(torch.tensor([0, 1, 2]), torch.randint(0, vocab, (3, 6), generator=g))]
    expected = torch.empty_like(logits)
    for j in range(4):
        context = torch.cat([history[0][1], extra[:, :j]], dim=1)
        expected[:, j] = lp.LogitsProcessorList(procs)(context, logits[:, j].clone())
    with Outputs() as ops:
        got = Scorer(procs, True, vocab).scores(history, extra, logits)
    assert torch.equal(got, expected)
    assert bool((got[:, :, [1, 3, 7]] == NEG).all())
    assert any("index_fill" in name for name, *_ in ops.seen) and not any("clone" in name for name, *_ in ops.seen)


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_verify_without_q_is_verify_with_one_hot_q(gamma):
    g = torch.Generator().manual_seed(gamma)
    vocab = 40
    p = torch.randn(64, gamma + 1, vocab, generator=g).mul(3).softmax(-1)
    x = p[:, :gamma].argmax(-1)  # likely enough to be kept: rows end both ways
    one_hot = torch.zeros(64, gamma, vocab).scatter_(-1, x.unsqueeze(-1), 1.0)
    n1, t1 = verify(p, one_hot, x, torch.Generator().manual_seed(9))
    n2, t2 = verify(p, None, x, torch.Generator().manual_seed(9))
    assert torch.equal(n1, n2) and torch.equal(t1, t2)
    if gamma:
        assert 0 < int((n1 < gamma).sum()) < 64, "some rows must reject (residual read) and some accept all"


def test_verify_reads_the_vocabulary_only_at_one_position_per_row():
    batch, gamma, vocab = 2, 4, 4096
    g = torch.Generator().manual_seed(0)
    p = torch.randn(batch, gamma + 1, vocab, generator=g).softmax(-1)
    q = torch.randn(batch, gamma, vocab, generator=g).softmax(-1)
    x = q.argmax(-1)
    for draft_q in (q, None):
        with Outputs() as ops:
            verify(p, draft_q, x, torch.Generator().manual_seed(0))
        assert max(n for *_, n in ops.seen) <= batch * vocab
