"""hfspec.drafts.sensitivity: one unit quantised at a time, on the embedded micro model and tiny models."""

import copy
import json
from pathlib import Path

import pytest
import torch
from tiny_models import build

from hfspec.cli import main
from hfspec.drafts.fidelity import fidelity
from hfspec.drafts.sensitivity import check_arguments, sensitivity, units_of
from hfspec.errors import HfspecError
from hfspec.io.loading import load_model
from hfspec.quant import groupwise
from hfspec.quant.calibrate import self_samples

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"


@pytest.fixture(scope="module")
def micro():
    return load_model(str(MICRO), role="target")


@pytest.fixture(scope="module")
def micro_by_bits(micro):
    return {bits: sensitivity(micro, bits=bits, tokens=128) for bits in (2, 3, 4, 8)}


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _untouched(model, before_logits, before_state, ids):
    assert torch.equal(_logits(model, ids), before_logits)
    after = model.state_dict()
    assert before_state.keys() == after.keys()
    assert all(torch.equal(before_state[k], after[k]) for k in before_state)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_micro_losses_are_non_negative_and_their_sum_follows_the_full_draft(micro_by_bits):
    for bits, r in micro_by_bits.items():
        assert [u.name for u in r.units][:1] and {u.kind for u in r.units} == {"attention", "mlp", "head"}
        assert len(r.units) == 4 * 2 + 1  # 4 layers × (attention, MLP) + head
        assert all(u.loss >= 0 and 0 <= u.overlap <= 1 + 1e-6 for u in r.units), bits
        assert [u.loss for u in r.units] == sorted((u.loss for u in r.units), reverse=True)
        assert sum(u.share for u in r.units) == pytest.approx(1.0)
        assert 0 <= r.recovered <= r.full_loss + 1e-6
        assert r.tokens == 128
    bits = sorted(micro_by_bits)
    full = torch.tensor([micro_by_bits[b].full_loss for b in bits])
    summed = torch.tensor([micro_by_bits[b].sum_loss for b in bits])
    assert torch.all(full[1:] < full[:-1]) and torch.all(summed[1:] < summed[:-1])  # more bits, less loss
    assert float(torch.corrcoef(torch.stack([full, summed]))[0, 1]) > 0.95  # measured 0.999
    # negative control: 8 bits loses far less than 2 bits, unit by unit and in all
    low, high = micro_by_bits[2], micro_by_bits[8]
    assert high.sum_loss < 0.1 * low.sum_loss and high.full_loss < 0.1 * low.full_loss  # measured 0.011, 0.012
    assert max(u.loss for u in high.units) < min(u.loss for u in low.units)


def test_weights_and_bytes_at_the_width(micro, micro_by_bits):
    four, eight = micro_by_bits[4], micro_by_bits[8]
    head = next(u for u in four.units if u.name == "head")
    n, k = micro.lm_head.weight.shape
    assert head.weights == n * k and head.matrices == ["lm_head"]
    assert head.bytes == n * k * 4 // 8 + 4 * n * groupwise.n_groups(k, 32)
    assert sum(u.weights for u in four.units) == sum(u.weights for u in eight.units)
    assert sum(u.bytes for u in four.units) < sum(u.bytes for u in eight.units)


def test_unit_overlap_is_that_of_a_copy_with_only_that_unit_quantised():
    target = build("llama", layers=2, init=0.2)
    report = sensitivity(target, bits=2, group_size=8, tokens=64, seed=3)
    ids = self_samples(target, 1, 64, 3)[:, :-1]
    for unit in report.units[:2]:
        twin = copy.deepcopy(target)
        with torch.no_grad():
            for name in unit.matrices:
                w = twin.get_submodule(name).weight
                w.copy_(groupwise.group_dequantize(*groupwise.group_quantize(w, 2, 8), 8, w.dtype))
        assert fidelity(target, twin, ids) == pytest.approx(unit.overlap, abs=1e-5)


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_target_is_unchanged_afterwards(micro, method):
    ids = torch.tensor([[0, 5, 17, 99, 3, 250, 1000]])
    logits, state = _logits(micro, ids), {k: v.clone() for k, v in micro.state_dict().items()}
    sensitivity(micro, bits=3, method=method, tokens=64)
    _untouched(micro, logits, state, ids)


def test_target_is_unchanged_when_stopped_midway(micro):
    ids = torch.tensor([[0, 5, 17, 99]])
    logits, state = _logits(micro, ids), {k: v.clone() for k, v in micro.state_dict().items()}

    def stop(message):
        if "unit 2/" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sensitivity(micro, bits=2, tokens=32, progress=stop)
    _untouched(micro, logits, state, ids)


def test_gptq_loses_less_than_rtn_on_a_tiny_gpt2():
    target = build("gpt2", layers=2, init=0.2)
    assert [u for u, _, _ in units_of(target)] == ["layer 0 attention", "layer 0 mlp", "layer 1 attention",
                                                    "layer 1 mlp", "head"]
    rtn = sensitivity(target, bits=2, group_size=8, tokens=64)
    gptq = sensitivity(target, bits=2, group_size=8, tokens=64, method="gptq")
    assert gptq.full_loss < rtn.full_loss and gptq.sum_loss < rtn.sum_loss  # measured 0.14 vs 0.22
    assert "--method gptq" in rtn.advice() and "gptq" not in gptq.advice().split("draft loses")[1]


def test_by_matrix_has_one_unit_per_matrix():
    target = build("llama", layers=2)
    units = units_of(target, "matrix")
    assert len(units) == 2 * 7 + 1 and all(len(names) == 1 for _, _, names in units)
    report = sensitivity(target, bits=4, group_size=8, tokens=16, by="matrix")
    assert {u.name for u in report.units} == {name for name, _, _ in units}


@pytest.mark.parametrize("kwargs,field", [
    ({"bits": 9}, "bits"), ({"bits": 1}, "bits"), ({"bits": True}, "bits"), ({"bits": "4"}, "bits"),
    ({"group_size": 4}, "group_size"), ({"method": "awq"}, "method"), ({"by": "head"}, "by"),
    ({"tokens": 0}, "tokens"),
])
def test_bad_input_names_the_field_before_anything_runs(kwargs, field):
    with pytest.raises(HfspecError, match=rf"^{field}: got .*; allowed: "):
        sensitivity(object(), **kwargs)  # not a model: the check comes first
    with pytest.raises(HfspecError, match=rf"^{field}: "):
        check_arguments(**({"bits": 4, "group_size": 32, "method": "rtn", "by": "layer", "tokens": 64} | kwargs))


def test_cli_prints_a_sorted_table_with_advice_and_writes_json(capsys, tmp_path):
    out = tmp_path / "sens.json"
    assert main(["sensitivity", "--target", "micro-rtn4", "--bits", "3", "--tokens", "64", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "unit" in text and "loss" in text and "share" in text and "bytes" in text
    assert "the 3 units costing most:" in text and "overlap the full rtn3-g32 draft loses" in text
    data = json.loads(out.read_text())
    assert data["bits"] == 3 and data["method"] == "rtn" and data["by"] == "layer" and data["tokens"] == 64
    losses = [u["loss"] for u in data["units"]]
    assert losses == sorted(losses, reverse=True) and len(losses) == 9
    assert data["units"][0]["name"] in text.splitlines()[2]  # the first row is the costliest unit
    assert data["advice"] in text and data["target"].endswith("micro")


def test_cli_takes_a_model_folder_and_matrices(capsys):
    assert main(["sensitivity", "--target", str(MICRO), "--by", "matrix", "--method", "gptq", "--tokens", "32"]) == 0
    text = capsys.readouterr().out
    assert "model.layers.0.mlp.down_proj" in text and "gptq4-g32" in text


@pytest.mark.parametrize("argv,field", [(["--method", "awq"], "method"), (["--by", "head"], "by"),
                                        (["--bits", "1"], "bits"), (["--json", "/no/such/folder/x.json"], "--json")])
def test_cli_bad_input(capsys, argv, field):
    assert main(["sensitivity", "--target", "/no/such/model", *argv]) == 2  # refused before the target loads
    assert capsys.readouterr().err.startswith(f"hfspec: error: {field}: ")
