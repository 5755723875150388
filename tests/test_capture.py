"""The calibration's Hessians from the inputs captured while the target writes its text (hfspec.quant.capture)."""

import pytest
import torch
from tiny_models import build

from hfspec.drafts import calibrated
from hfspec.quant import calibrate as cal
from hfspec.quant.calibrate import Calibration, calibration_matrices, hessians, self_samples
from hfspec.quant.capture import TextInputs


@pytest.fixture(autouse=True)
def _cache_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(calibrated, "CALIBRATION_DIR", tmp_path / "calibrated")


def _captured(model, sequences, tokens, budget=1 << 30, finish=True):
    names = list(calibration_matrices(model))
    with TextInputs(model, names, sequences * (tokens + 1), budget) as captured:
        ids = self_samples(model, sequences, tokens, seed=0)
        if finish:
            captured.finish(ids)
    return names, ids, captured


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_inputs_captured_while_writing_give_the_forward_hessians(arch):
    """Every matrix's Σ x xᵀ from the text's own decoding steps (the last token fed once more through the cache)
    equals a forward of the whole text's; q/k/v and gate/up share one buffer; buffers are freed as they are used.
    Control: without the last tokens' step the capture is not complete."""
    model = build(arch, hidden=64)
    names, ids, captured = _captured(model, 3, 12)
    assert captured.complete
    if arch != "gpt2":  # (GPT-2's c_attn is q, k and v in one matrix)
        assert len(captured.buffers) < len(names), "matrices fed one input share one buffer"
    want = hessians(model, ids, names)
    for name in names:
        got = captured.hessian(name)
        assert torch.allclose(got, want[name], rtol=1e-4, atol=1e-5 * float(want[name].abs().max())), name
    assert not captured.buffers and not captured._grams, "every buffer and product freed once used"
    assert not _captured(model, 3, 12, finish=False)[2].complete


def test_capture_over_its_budget_stops_and_frees_what_it_held():
    """A budget below the text's inputs stops capturing at the first step (nothing held), and calibrate then
    takes the Hessians by forwards: the same codes; within the budget no forward runs after the text."""
    model = build("llama", hidden=64)
    names, _, small = _captured(model, 3, 12, budget=1000)
    assert small.over and not small.complete and small.held == 0 and not small.buffers

    settings = Calibration(sequences=6, tokens=23)
    forwards, after = [], []
    real = cal._streamed

    def counted(*args, **kwargs):
        forwards.append(1)
        return real(*args, **kwargs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cal, "_streamed", counted)
        captured = cal.calibrate(model, 4, 32, settings, capture_bytes=1 << 30, after_text=lambda: after.append(1))
        assert not forwards and after == [1]
        fallback = cal.calibrate(model, 4, 32, settings, capture_bytes=1000, after_text=lambda: after.append(2))
        assert forwards == [1] and after == [1], "over the budget: forwards, and the prepacked copy kept for them"
    assert set(captured) == set(fallback) == set(names)
    agree = [float((captured[n].q == fallback[n].q).float().mean()) for n in names]
    assert min(agree) > 0.99, agree


def test_sequential_calibration_captures_nothing():
    """`sequential` needs each layer's Hessians on the quantised layers' outputs: the text's inputs are of no use."""
    model = build("llama", hidden=64)
    seen = []
    real = TextInputs._seen

    def watched(self, name, x):
        real(self, name, x)
        seen.append(self.held)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TextInputs, "_seen", watched)
        cal.calibrate(model, 4, 32, Calibration(sequences=4, tokens=16, sequential=True))
    assert seen and max(seen) == 0
