"""Calibrated (GPTQ) drafts: the tensor maths, the codes in the draft's storage, the disk cache, exactness."""

import warnings
from pathlib import Path

import laws
import pytest
import torch
from laws import WRONG_RULES
from tiny_models import build

import hfspec
import hfspec.decoding.sampling as sampling
from hfspec.attrs import CALIBRATION, DRAFT_SPEC, get_attr
from hfspec.drafts import calibrated, make_draft
from hfspec.drafts.fidelity import fidelity
from hfspec.drafts.registry import parse
from hfspec.errors import HfspecError
from hfspec.kernels import fast_linear
from hfspec.quant import calibrate, gptq, refit
from hfspec.quant.calibrate import Calibration, Coded, calibration_matrices, self_samples
from hfspec.quant.groupwise import group_dequantize, group_quantize

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"
QUICK = Calibration(sequences=16, tokens=64)


@pytest.fixture(autouse=True)
def _cache_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrated, "CALIBRATION_DIR", tmp_path / "calibrated")


def _correlated(k=64, rows=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) / k**0.5
    x = torch.randn(rows, k, generator=g) @ mix + 0.05 * torch.randn(rows, k, generator=g)
    x[:, :3] *= 8  # a few outlier channels, as real activations have
    return x


# ------------------------------------------------------------------------------------------------ tensor maths
def test_identity_hessian_is_rtn():
    """With H = I no error moves to other columns and no clipping is tried: GPTQ is RTN, code for code."""
    w = torch.randn(48, 96) * 0.05
    q, s, z = gptq.gptq_quantize(w, torch.eye(96, dtype=torch.float64), 4, 32, damp=0.0, shrink=(1.0,))
    rq, rs, rz = group_quantize(w, 4, 32)
    assert torch.equal(q, rq) and torch.equal(s, rs) and torch.equal(z, rz)


@pytest.mark.parametrize("bits,group", [(4, 32), (3, 32), (4, 24)])
def test_gptq_is_rtn_format_and_closer_on_outputs(bits, group):
    x = _correlated()
    w = torch.randn(40, 64) * 0.05
    h = gptq.hessian_update(None, x)
    q, s, z = gptq.gptq_quantize(w, h, bits, group)
    assert q.dtype == torch.uint8 and int(q.max()) < 2**bits
    assert s.dtype == z.dtype == torch.float16 and s.shape == (40, -(-64 // group))
    rtn = group_dequantize(*group_quantize(w, bits, group), group)
    mine = group_dequantize(q, s, z, group)
    assert gptq.output_error(w, mine, h) < 0.7 * gptq.output_error(w, rtn, h)
    # negative control: on outputs of other (uncorrelated) inputs GPTQ has no such edge
    other = gptq.hessian_update(None, torch.randn(2048, 64))
    assert gptq.output_error(w, mine, other) > 0.7 * gptq.output_error(w, rtn, other)


@pytest.mark.parametrize("k,group", [(64, 32), (56, 24)])
def test_refit_grid_is_the_least_output_error_for_its_codes(k, group):
    """With the codes fixed, the refit grid's output error is below GPTQ's own grid and below any small move of
    it (it is the least-squares optimum); on another input distribution it has no such edge (negative control)."""
    x = _correlated(k=k)
    w = torch.randn(40, k) * 0.05
    h = gptq.hessian_update(None, x)
    q, s, z = gptq.gptq_quantize(w, h, 4, group, act_order=True)
    s2, z2 = refit.refit_grid(w, h, q, s, z, group, damp=0.0)
    assert s2.dtype == z2.dtype == torch.float16 and s2.shape == s.shape and bool((s2 > 0).all())
    err = lambda sc, ze, hh=h: gptq.output_error(w, group_dequantize(q, sc, ze, group), hh)  # noqa: E731
    assert err(s2, z2) < 0.97 * err(s, z)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        moved = (s2.float() * (1 + 0.01 * torch.randn(s2.shape, generator=g))).half()
        assert err(moved, z2) > err(s2, z2)
    other = gptq.hessian_update(None, torch.randn(2048, k, generator=g))
    assert err(s2, z2, other) > 0.9 * err(s, z, other)


def test_refit_grid_eliminating_the_offsets_solves_the_same_systems(monkeypatch):
    """The offsets' block is shared by every row, so the refit eliminates it (Schur complement, one G-sized factor
    a row): its grids equal those of each row's whole 2G system, solved directly; a wrong elimination (the
    shared block's inverse factor transposed) does not (negative control)."""
    x = _correlated(k=128)
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(5)) * 0.05
    h = gptq.hessian_update(None, x)
    q, s, z = gptq.gptq_quantize(w, h, 4, 32, act_order=True)
    schur = refit.refit_grid(w, h, q, s, z, 32)
    factor = refit._offsets_factor
    monkeypatch.setattr(refit, "_offsets_factor", lambda m22: None)
    whole = refit.refit_grid(w, h, q, s, z, 32)
    for a, b in zip(schur, whole, strict=True):
        assert (a.float() - b.float()).abs().max() <= 2e-3 * b.float().abs().max()
    assert not torch.equal(schur[0], s), "the grids moved"
    monkeypatch.setattr(refit, "_offsets_factor", lambda m22: (factor(m22)[0].t().contiguous(), factor(m22)[1]))
    wrong = refit.refit_grid(w, h, q, s, z, 32)
    assert (wrong[1].float() - whole[1].float()).abs().max() > 1e-2 * whole[1].float().abs().max()


def test_refit_error_change_from_the_eliminated_parts_is_the_output_error_change():
    """The eliminated refit never forms a row's whole system, so it reads each row's change of output error from
    its parts (projected Hessian, S H, C⁻¹): that equals the change measured directly, (w − ŵ) H (w − ŵ)ᵀ row by
    row, for a grid moved any way; reading it with the offsets' block left out does not (negative control)."""
    x = _correlated(k=96)
    g = torch.Generator().manual_seed(6)
    w = torch.randn(12, 96, generator=g) * 0.05
    h = gptq.hessian_update(None, x).float()
    q, s, z = gptq.gptq_quantize(w, h, 4, 32, act_order=True)
    hf = h.clone()  # no dampening: the system is H's own
    m22 = hf.view(3, 32, 3, 32).sum(dim=(1, 3))
    system = refit._Eliminated(hf, w.float(), hf.view(3, 32, 3, 32).sum(dim=1), m22, *refit._offsets_factor(m22))
    mid = 7.5
    old = torch.cat([s.float(), z.float() + mid * s.float()], 1)
    _, _, finite, change = system.solve(q.float().view(12, 3, 32) - mid, 0, 12, old)
    assert bool(finite.all())
    new = old * (1 + 0.05 * torch.randn(old.shape, generator=g))
    grid = lambda t: (t[:, :3], t[:, 3:] - mid * t[:, :3])  # noqa: E731

    def row_error(t):
        d = (w - group_dequantize(q, *(x.half() for x in grid(t)), 32).float()).double()
        return torch.einsum("nk,kl,nl->n", d, h.double(), d)
    rounded = torch.cat([grid(new)[0].half().float(), grid(new)[1].half().float() + mid * grid(new)[0].half().float()], 1)
    direct = row_error(rounded) - row_error(old)
    got = change(rounded)
    assert torch.allclose(got, direct, rtol=1e-3, atol=1e-6 * float(direct.abs().max())), (got, direct)
    system.m22 = torch.zeros_like(m22)
    assert not torch.allclose(change(rounded), direct, rtol=1e-2)


def _paper_gptq(w, h, bits, group, damp=gptq.DAMP):
    """The paper's sweep, column by column, written plainly: errors pushed with the upper Cholesky factor of
    H⁻¹, each group's grid chosen from its columns as the sweep has moved them when it reaches the group."""
    k = w.shape[1]
    hd = h.double() + damp * float(torch.diagonal(h).double().mean()) * torch.eye(k, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hd)), upper=True).float()
    w = w.clone().float()
    q = torch.empty(w.shape, dtype=torch.uint8)
    top = 2**bits - 1
    for j in range(k):
        if j % group == 0:
            s, z = gptq.group_grid(w[:, j:j + group], bits)
        sf, zf = s.float(), z.float()
        code = ((w[:, j] - zf) / sf).round().clamp(0, top)
        q[:, j] = code.to(torch.uint8)
        e = (w[:, j] - (code * sf + zf)) / u[j, j]
        w[:, j + 1:] -= e[:, None] * u[j, j + 1:][None, :]
    return q


@pytest.mark.parametrize("k,group", [(96, 32), (320, 32), (72, 24)])
def test_sweep_is_the_papers_column_by_column_update(k, group):
    """The pull-form sweep (UDUᵀ factor of H, blocks of blocks) rounds every weight as the paper's push form
    does with H⁻¹'s Cholesky factor, dynamic group grids included; a sweep fed another input's Hessian does
    not (negative control)."""
    x = _correlated(k=k)
    w = torch.randn(24, k, generator=torch.Generator().manual_seed(k)) * 0.05
    h = gptq.hessian_update(None, x)
    q, _, _ = gptq.gptq_quantize(w, h, 4, group)
    paper = _paper_gptq(w, h, 4, group)
    assert (q == paper).float().mean() > 0.999
    wrong = gptq.hessian_update(None, torch.randn(2048, k, generator=torch.Generator().manual_seed(9)))
    assert (gptq.gptq_quantize(w, wrong, 4, group)[0] == paper).float().mean() < 0.95


def test_a_given_grid_is_swept_against_as_given():
    x = _correlated()
    w = torch.randn(16, 64) * 0.05
    h = gptq.hessian_update(None, x)
    q, s, z = gptq.gptq_quantize(w, h, 4, 32, act_order=True)
    s2, z2 = refit.refit_grid(w, h, q, s, z, 32)
    q2, s3, z3 = gptq.gptq_quantize(w, h, 4, 32, act_order=True, grid=(s2, z2))
    assert torch.equal(s3, s2) and torch.equal(z3, z2) and not torch.equal(q2, q)


def test_batched_sweep_equals_one_at_a_time():
    x1, x2 = _correlated(seed=1), _correlated(seed=2)
    w = torch.randn(2, 32, 64) * 0.05
    h = torch.stack([gptq.hessian_update(None, x1), gptq.hessian_update(None, x2)])
    qb, sb, zb = gptq.gptq_quantize(w, h, 4, 32)
    for i in range(2):
        q, s, z = gptq.gptq_quantize(w[i], h[i], 4, 32)
        assert torch.equal(q, qb[i]) and torch.equal(s, sb[i]) and torch.equal(z, zb[i])


def test_dead_input_column_is_rounded_plainly():
    x = _correlated()
    x[:, 5] = 0.0
    h = gptq.hessian_update(None, x)
    q, s, z = gptq.gptq_quantize(torch.randn(8, 64), h, 4, 32)
    assert torch.isfinite(s.float()).all() and torch.isfinite(z.float()).all()


# ------------------------------------------------------------------------------------------------ drafts
def test_rtn_codes_through_the_codes_path_give_the_rtn_draft():
    """The plumbing: a calibrated draft given RTN's own codes is the rtn draft, logit for logit."""
    target = build("llama", vocab=96, layers=2, hidden=64)
    codes = {}
    for module in calibration_matrices(target).values():
        codes[id(module.weight)] = Coded(*group_quantize(module.weight, 4, 32))
    from hfspec.drafts.rtn import make_rtn_draft

    ids = torch.tensor([[0, 5, 17, 33, 9, 40]])
    for lean in (None, False):
        a = make_rtn_draft(target, 4, 32, lean=lean, head_top=0 if lean is None else None)
        b = make_rtn_draft(target, 4, 32, lean=lean, head_top=0 if lean is None else None, codes=codes)
        assert torch.equal(a(ids).logits, b(ids).logits)


@pytest.fixture(scope="module")
def micro():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32).eval()


def test_calibrated_draft_is_closer_than_rtn(micro, tmp_path):
    """On a trained model at 3 bits, over text the target writes itself (not the calibration text)."""
    ids = self_samples(micro, 2, 48, seed=123)
    rtn = make_draft(micro, "rtn3", head_top=0)
    cal = make_draft(micro, "gptq3-top0", calibration=QUICK)
    f_rtn, f_cal = fidelity(micro, rtn, ids), fidelity(micro, cal, ids)
    assert f_cal > f_rtn + 0.01, (f_rtn, f_cal)
    assert get_attr(cal, DRAFT_SPEC) == "gptq3-g32-top0"


def test_cache_is_used_and_keyed_by_weights(micro):
    first = make_draft(micro, "gptq4", calibration=QUICK)
    assert get_attr(first, CALIBRATION).startswith("calibrated in") and "cached:" in get_attr(first, CALIBRATION)
    again = make_draft(micro, "gptq4", calibration=QUICK)
    assert get_attr(again, CALIBRATION).startswith("cache:")
    ids = torch.tensor([[0, 5, 17, 33, 9]])
    assert torch.equal(first(ids).logits, again(ids).logits)
    other = Calibration(sequences=16, tokens=64, seed=1)
    assert get_attr(make_draft(micro, "gptq4", calibration=other), CALIBRATION).startswith("calibrated in")
    import copy

    changed = copy.deepcopy(micro)
    with torch.no_grad():
        changed.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3
    assert get_attr(make_draft(changed, "gptq4", calibration=QUICK), CALIBRATION).startswith("calibrated in")


def test_damaged_cache_entry_is_replaced(micro):
    make_draft(micro, "gptq4", calibration=QUICK)
    (entry,) = calibrated.CALIBRATION_DIR.glob("*.safetensors")
    entry.write_bytes(entry.read_bytes()[:100])
    with pytest.warns(UserWarning, match="unusable"):
        draft = make_draft(micro, "gptq4", calibration=QUICK)
    assert get_attr(draft, CALIBRATION).startswith("calibrated in")
    assert get_attr(make_draft(micro, "gptq4", calibration=QUICK), CALIBRATION).startswith("cache:")


def test_interrupted_or_full_disk_write_leaves_no_entry(micro, monkeypatch):
    import safetensors.torch

    def full_disk(*args, **kwargs):
        Path(args[1]).write_bytes(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.warns(UserWarning, match="not cached"):
        draft = make_draft(micro, "gptq4", calibration=QUICK)
    assert "not cached" in get_attr(draft, CALIBRATION)
    assert not list(calibrated.CALIBRATION_DIR.iterdir())  # neither an entry nor a partial file

    def killed(*args, **kwargs):
        Path(args[1]).write_bytes(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(safetensors.torch, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        make_draft(micro, "gptq4", calibration=QUICK)
    assert not list(calibrated.CALIBRATION_DIR.iterdir())


def test_unusable_cache_folder_still_builds(micro, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(calibrated, "CALIBRATION_DIR", blocker / "calibrated")
    with pytest.warns(UserWarning, match="not cached"):
        draft = make_draft(micro, "gptq4", calibration=QUICK)
    assert draft(torch.tensor([[0, 5]])).logits.shape[-1] == micro.config.vocab_size


def test_progress_reports_calibration(micro):
    said = []
    make_draft(micro, "gptq4", calibration=QUICK, progress=said.append)
    assert any("writes 16 × 64 tokens" in s for s in said)
    assert any("matrices quantised" in s and "left" in s for s in said)


@pytest.mark.parametrize("spec,label", [("gptq4", "gptq4-g32"), ("gptq3-g64", "gptq3-g64"),
                                        ("GPTQ4-top0-compiled", "gptq4-g32-top0-compiled")])
def test_spec_labels(spec, label):
    assert parse(spec).label == label


@pytest.mark.parametrize("spec,needle", [("gptq9", "bits must be 2..8"), ("gptq4-g4", "group size"),
                                         ("gptqx", "cannot read"), ("gptq4-top9999", "-topK")])
def test_bad_specs_name_the_field(spec, needle):
    with pytest.raises(HfspecError, match=needle):
        parse(spec)


def test_bad_calibration_option():
    with pytest.raises(HfspecError, match="calibration"):
        make_draft(build("llama"), "gptq4", calibration={"sequences": 4})


# ------------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gpt_neox"])
def test_greedy_identity_with_calibrated_drafts(arch):
    target = build(arch, init=0.2, hidden=64)
    draft = make_draft(target, "gptq3", calibration=QUICK)
    ids = torch.tensor([[0, 5, 17, 33, 9]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=60, min_new_tokens=60)
    out = hfspec.generate(target, ids, draft=draft, gamma=4, temperature=0, max_new_tokens=60, min_new_tokens=60)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted < out.stats.checked


V, NEW, ROWS = 8, 3, 20_000


@pytest.fixture(scope="module")
def small_pair():
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 2-bit copy of a tiny random model is far from it: the point here
        draft = make_draft(target, "gptq2", calibration=Calibration(sequences=8, tokens=16))
    return target, draft


def _samples(target, draft, prompt, seed):
    ids = torch.tensor([prompt] * ROWS)
    out = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=1.0, max_new_tokens=NEW,
                          min_new_tokens=NEW, seed=seed)
    return out.sequences[:, len(prompt):], out.stats


@pytest.mark.slow
def test_law_with_calibrated_draft_and_negative_control(small_pair, monkeypatch):
    target, draft = small_pair
    prompt = [0, 3]
    law = laws.exact_law(target, prompt, V, NEW)
    new, stats = _samples(target, draft, prompt, seed=11)
    assert stats.accepted < stats.checked, "the draft must be rejected sometimes"
    assert laws.p_value(new, law, V, NEW) > 1e-3
    name, wrong_rule = WRONG_RULES["residual-without-subtraction"]
    monkeypatch.setattr(sampling, name, wrong_rule)
    wrong, _ = _samples(target, draft, prompt, seed=11)
    assert laws.p_value(wrong, law, V, NEW) < 1e-6


def test_calibration_samples_are_seeded(micro):
    a = self_samples(micro, 2, 8, seed=3)
    b = self_samples(micro, 2, 8, seed=3)
    c = self_samples(micro, 2, 8, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    before = torch.random.get_rng_state()
    self_samples(micro, 1, 4, seed=5)
    assert torch.equal(before, torch.random.get_rng_state()), "calibration must not move the user's RNG"


def _masked_softmax(model, ids, eos):
    logits = model(torch.tensor([ids])).logits[0, -1].float()
    logits[eos] = float("-inf")  # min_new_tokens: EOS cannot end the text early
    return torch.softmax(logits, -1)


def test_calibration_text_is_drawn_from_the_models_own_law(monkeypatch):
    """`self_samples` draws each token from the model's softmax (inverse CDF on its own generator): chi-square of the
    first two tokens of many texts against the law enumerated from forwards. Control: the same draw at temperature
    0.5 instead of 1 must fail."""
    from hfspec.quant import selftext

    vocab, n = 8, 6000
    model = build("llama", vocab=vocab, init=0.5)
    with torch.no_grad():
        first = _masked_softmax(model, [0], 1)
        law = {(a, b): float(first[a] * p) for a in range(vocab)
               for b, p in enumerate(_masked_softmax(model, [0, a], 1))}
    assert laws.p_value(self_samples(model, n, 2, seed=7)[:, 1:], law, vocab, 2) > 1e-3

    class Colder(selftext.InverseCdf):
        def __call__(self, input_ids, scores):
            return super().__call__(input_ids, scores.float() * 2)  # T = 0.5

    monkeypatch.setattr(selftext, "InverseCdf", Colder)
    assert laws.p_value(self_samples(model, n, 2, seed=7)[:, 1:], law, vocab, 2) < 1e-6


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_shared_input_hessians_equal_per_matrix_sums(arch):
    """q/k/v (and gate/up) share one product per input; each matrix still gets exactly its own inputs' Σ x xᵀ."""
    from hfspec.quant.calibrate import hessians

    model = build(arch, hidden=64)
    ids = torch.randint(3, 96, (4, 20), generator=torch.Generator().manual_seed(0))
    names = list(calibration_matrices(model))
    got = hessians(model, ids, names, rows_per_pass=2)
    want, hooks = {}, []
    for name in names:
        def hook(mod, args, name=name):
            want[name] = gptq.hessian_update(want.get(name), args[0].detach().float())
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    with torch.no_grad():
        for start in (0, 2):
            model(ids[start:start + 2], use_cache=False)
    for h in hooks:
        h.remove()
    assert set(got) == set(names)
    for name in names:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-6 * float(want[name].abs().max())), name


def test_sequential_calibration_restores_the_target(micro):
    ids = torch.tensor([[0, 5, 17, 33, 9]])
    before = micro(ids).logits
    weights = {n: p.detach().clone() for n, p in micro.named_parameters()}
    seq = Calibration(sequences=16, tokens=64, sequential=True)
    draft = make_draft(micro, "gptq3-top0", calibration=seq)
    assert torch.equal(micro(ids).logits, before)
    assert all(torch.equal(p, weights[n]) for n, p in micro.named_parameters())
    flat = make_draft(micro, "gptq3-top0", calibration=QUICK)
    assert not torch.equal(draft(ids).logits, flat(ids).logits), "the sequential order changes the codes"
    samples = self_samples(micro, 2, 48, seed=123)
    assert fidelity(micro, draft, samples) > fidelity(micro, make_draft(micro, "rtn3-top0"), samples)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("held", [1 << 30, 1])
def test_streamed_calibration_gives_the_whole_model_hessians_codes(arch, held, monkeypatch):
    """One layer's Hessians at a time on the streamed hidden states (what keeps a 1.7B calibration in memory)
    gives the codes one forward of the whole model gives; the sequential order (quantised stream) does not."""
    from hfspec.quant import calibrate as cal

    monkeypatch.setattr(cal, "HESSIAN_BYTES", held)  # all layers' Hessians at once, or one layer at a time
    model = build(arch, hidden=64)
    ids = torch.randint(3, 96, (6, 24), generator=torch.Generator().manual_seed(1))
    names = list(calibration_matrices(model))
    settings = Calibration(sequences=6, tokens=23)
    meter = cal._Meter(lambda message: None, 0.0, {name: 1.0 for name in names})
    layers = cal._layers(model)
    assert layers is not None
    layer_names = [n for n in names if n.startswith(layers[0] + ".")]
    assert set(names) - set(layer_names), "the head is outside the layers: its Hessian comes from the last pass"
    whole = cal.gptq_codes(model, cal.hessians(model, ids, names), names, 4, 32, settings, meter)
    streamed = cal._streamed(model, layers, ids, names, 4, 32, settings, meter)
    sequential = cal._streamed(model, layers, ids, layer_names, 4, 32,
                               Calibration(sequences=6, tokens=23, sequential=True), meter)
    assert set(streamed) == set(names)
    agree = [float((whole[n].q == streamed[n].q).float().mean()) for n in names]
    assert min(agree) > 0.99, agree
    assert all("forward" not in block.__dict__ for block in layers[1]), "the real forwards are back"
    last = [n for n in layer_names if n.startswith(f"{layers[0]}.{len(layers[1]) - 1}.")]
    assert any(not torch.equal(whole[n].q, sequential[n].q) for n in last), "the quantised stream must differ"


def test_refit_grid_keeps_the_grid_where_the_system_is_singular_or_not_finite():
    """A group no input reaches (H's rows and columns 0, no dampening) leaves its scale and zero undetermined:
    they stay GPTQ's, finite, while the other group's move. A non-finite Hessian entry poisons every row's
    system: the whole grid stays."""
    x = _correlated(k=64)
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(4)) * 0.05
    h = gptq.hessian_update(None, x)
    q, s, z = gptq.gptq_quantize(w, h, 4, 32, act_order=True)
    dead = h.clone()
    dead[:32], dead[:, :32] = 0.0, 0.0
    s2, z2 = refit.refit_grid(w, dead, q, s, z, 32, damp=0.0)
    assert torch.isfinite(s2.float()).all() and torch.isfinite(z2.float()).all()
    moved = ~(torch.eq(s2[:, 1], s[:, 1]) & torch.eq(z2[:, 1], z[:, 1]))
    assert bool(moved.any()), "the reached group's grid moves"
    assert torch.equal(s2[moved, 0], s[moved, 0]) and torch.equal(z2[moved, 0], z[moved, 0])
    poisoned = h.clone()
    poisoned[5, 7] = float("nan")
    s3, z3 = refit.refit_grid(w, poisoned, q, s, z, 32)
    assert torch.equal(s3, s) and torch.equal(z3, z)


def test_gram_by_blocks_is_the_full_product_and_symmetric():
    """The Hessians' xᵀx multiplies only the blocks on and above the diagonal: the same matrix as x.t() @ x
    (to rounding), exactly symmetric, every block filled (an unfilled block would be uninitialised memory)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 2100, generator=g)
    full = x.t() @ x
    blocked = calibrate._gram(x)
    assert torch.allclose(blocked, full, rtol=1e-5, atol=1e-3) and torch.equal(blocked, blocked.t())
    assert not torch.allclose(calibrate._gram(torch.randn(64, 2100, generator=g)), full, atol=1e-1)


def test_calibration_eta_weighs_matrices_by_their_work(monkeypatch):
    """The ETA counts each matrix's N·K² (a 2048 × 8192 down projection is 4× the work of an 8192 × 2048 one) and
    the time since quantising began: after a small matrix in 10 s, a three times larger one is 30 s away (a count
    of matrices would say 10 s; the time since the calibration began, with its sampling, would say more)."""
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: next(clock))
    said = []
    meter = calibrate._Meter(said.append, 40.0, {"small": 1.0, "large": 3.0})
    meter.add(["small"])
    assert said == ["calibrating: 1/2 matrices quantised (70 s, about 30 s left)"]


def test_calibration_eta_counts_the_hessians_already_taken(monkeypatch):
    """A small model's Hessians are all taken before its first matrix is quantised: the ETA counts that work as
    done (`passed`), so after the Hessians (6 units) and a small matrix (1) in 14 s, a large matrix (3) is 6 s
    away; counting quantisation alone would say 42 s (the failure seen at 135M: 139 s said, 18 s left)."""
    clock = iter([100.0, 114.0, 100.0, 114.0])
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: next(clock))
    said = []
    meter = calibrate._Meter(said.append, 40.0, {"small": 1.0, "large": 3.0}, {"small": 2.0, "large": 4.0})
    meter.passed(["small", "large"])
    meter.add(["small"])
    assert said == ["calibrating: 1/2 matrices quantised (74 s, about 6 s left)"]
    blind = calibrate._Meter(said.append, 40.0, {"small": 1.0, "large": 3.0})
    blind.add(["small"])
    assert said[-1].endswith("about 42 s left)")


def test_calibration_work_of_a_matrix_grows_with_the_calibration_tokens():
    micro = build("llama")
    name = next(iter(calibration_matrices(micro)))
    n, k = calibrate._weight(micro.get_submodule(name)).shape
    gptq_work, pass_work = calibrate._work(micro, [name], tokens=1000)
    assert gptq_work[name] == n * k * k
    assert pass_work[name] == pytest.approx(calibrate.PASS_WORK * 1000 * (n * k + k * k / 2))
    assert calibrate._work(micro, [name])[1][name] == 0.0


@pytest.mark.skipif(not fast_linear.available(), reason="no oneDNN in this torch")
def test_calibration_runs_on_prepacked_weights_and_gives_the_target_back(micro, monkeypatch):
    """The target's fp32 linears are oneDNN-prepacked while it writes its calibration text and its Hessians are
    taken (faster at 64 rows), and unpacked after, also when calibrating fails; a target the user prepacked stays
    so; with too little memory free for the copy it calibrates on the weights as they are (the control)."""
    import copy

    seen = []
    real = calibrate.self_samples

    def watched(model, *args):
        seen.append(fast_linear.prepacked_bytes(model))
        return real(model, *args)
    monkeypatch.setattr(calibrate, "self_samples", watched)
    said = []
    make_draft(micro, "gptq4", calibration=QUICK, progress=said.append)
    assert seen[-1] > 0 and any("prepacked" in s for s in said)
    assert fast_linear.prepacked_bytes(micro) == 0
    monkeypatch.setattr(calibrated, "PREPACK_MARGIN", 1 << 60)  # more than any machine has free
    make_draft(micro, "gptq4", calibration=Calibration(sequences=16, tokens=64, seed=3))
    assert seen[-1] == 0
    monkeypatch.setattr(calibrated, "PREPACK_MARGIN", 0)
    mine = copy.deepcopy(micro)
    fast_linear.prepack(mine)
    make_draft(mine, "gptq4", calibration=QUICK)
    assert fast_linear.prepacked_bytes(mine) > 0

    def broken(*args, **kwargs):
        raise RuntimeError("stopped")
    monkeypatch.setattr(calibrate, "self_samples", broken)
    with pytest.raises(RuntimeError, match="stopped"):
        make_draft(micro, "gptq4", calibration=Calibration(sequences=16, tokens=64, seed=4))
    assert fast_linear.prepacked_bytes(micro) == 0


def test_default_calibration_doubles_the_text_for_small_targets(monkeypatch, tmp_path):
    """A target of at most SMALL_TARGET parameters is calibrated on 256 × 32 tokens, a larger one on Calibration()'s
    128 × 32; a draft built without `calibration` is cached under the default its target gets."""
    model = build("llama")
    assert calibrate.default_calibration(model) == Calibration(sequences=calibrate.SMALL_TEXT_SEQUENCES)
    monkeypatch.setattr(calibrate, "SMALL_TARGET", 10)
    assert calibrate.default_calibration(model) == Calibration()
    seen = []
    real = calibrate.calibrate

    def watched(model, bits, group_size, settings=None, *args, **kwargs):
        seen.append(settings)
        return real(model, bits, group_size, Calibration(sequences=2, tokens=4), *args, **kwargs)

    monkeypatch.setattr(calibrated, "calibrate", watched)
    calibrated.calibrated_codes(model, 4, 32, folder=tmp_path)
    assert seen == [Calibration()]
    assert (calibrated.cache_path(model, 4, 32, Calibration(), tmp_path)).exists()


def test_calibration_text_ignores_the_models_generation_settings(micro):
    """A repetition penalty or n-gram ban in the model's generation config (Qwen2.5's carries one) would change the
    text `generate` writes; the calibration text is the model's own law whatever the config says, and the config is
    given back. Control: the same settings do change a plain generate's text."""
    plain = self_samples(micro, 2, 24, seed=3)
    config = micro.generation_config
    start = torch.full((2, 1), 1)
    before = micro.generate(start, do_sample=False, max_new_tokens=24, min_new_tokens=24, pad_token_id=1)
    saved = config.repetition_penalty, config.no_repeat_ngram_size
    try:
        config.repetition_penalty, config.no_repeat_ngram_size = 5.0, 1
        assert torch.equal(self_samples(micro, 2, 24, seed=3), plain)
        assert micro.generation_config is config
        after = micro.generate(start, do_sample=False, max_new_tokens=24, min_new_tokens=24, pad_token_id=1)
        assert not torch.equal(before, after), "control: the settings change what generate writes"
    finally:
        config.repetition_penalty, config.no_repeat_ngram_size = saved
