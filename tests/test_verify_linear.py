"""The few-row fp32 kernel of the verify pass (`hfspec.kernels.verify_linear`): F.linear's values on every row
count it takes, the target's greedy text through a real speculative decode, linears routed only inside a decode
and restored after, and every way it cannot be built (no compiler, an unusable folder, a damaged library) leaving
F.linear in place with the reason, never a broken file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_models import build, perturbed

import hfspec
from hfspec.attrs import BITWISE_VERIFY, set_attr
from hfspec.audit.exactness import check_greedy
from hfspec.errors import HfspecError
from hfspec.kernels import fast_linear, verify_linear


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """The kernel on, built in a folder of this test's own; the process's built kernel forgotten before and after."""
    monkeypatch.setenv(verify_linear.MODE_ENV, "on")
    monkeypatch.setenv(verify_linear.KERNEL_DIR_ENV, str(tmp_path / "kernels"))
    verify_linear.reset()
    yield tmp_path / "kernels"
    verify_linear.reset()


def _buildable() -> str:
    """'' where this machine can build the kernel, else why not (the tests needing it skip with that reason)."""
    capability = torch.backends.cpu.get_cpu_capability().lower()
    if "avx512" not in capability and "avx2" not in capability:
        return "the few-row kernel needs AVX-512 or AVX2"
    if os.uname().machine != "x86_64":
        return "the few-row kernel is built for x86-64 only"
    return ""


MICRO = str(Path(__file__).resolve().parents[1] / "presets" / "models" / "micro")
needs_kernel = pytest.mark.skipif(bool(_buildable()), reason=_buildable() or "buildable")


@needs_kernel
def test_the_kernel_computes_f_linear_on_every_row_count(kernel_env):
    assert verify_linear.kernel() is not None, verify_linear.status()
    assert "few-row kernel" in verify_linear.status() and str(kernel_env) in verify_linear.status()
    generator = torch.Generator().manual_seed(3)
    for k, n in ((576, 200), (41, 33), (1536, 96)):
        w = torch.randn(n, k, generator=generator)
        b = torch.randn(n, generator=generator)
        for rows in range(1, 36):
            x = torch.randn(1, rows, k, generator=generator)
            for bias in (None, b):
                got, want = verify_linear.linear(x, w, bias), F.linear(x, w, bias)
                assert got.shape == want.shape == (1, rows, n)
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                # bf16: the fp32 product of the same bf16 values, rounded once to bf16
                xb, wb, bb = x.bfloat16(), w.bfloat16(), None if bias is None else bias.bfloat16()
                got = verify_linear.linear(xb, wb, bb)
                assert got.dtype == torch.bfloat16
                exact = F.linear(xb.float(), wb.float(), None if bb is None else bb.float())
                torch.testing.assert_close(got.float(), exact, rtol=2 ** -7, atol=2 ** -7 * exact.abs().max().item())
    # negative control: a wrong weight must not pass the same comparison
    x = torch.randn(4, 576, generator=generator)
    w = torch.randn(64, 576, generator=generator)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(verify_linear.linear(x, w), F.linear(x, w.flip(0)), rtol=1e-4, atol=1e-4)


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(kernel_env):
    """Every row of a many-row call is bit for bit that row computed alone, whatever the call's chunks (16 rows as
    8 + 8) and however the rows of w are paired (odd N leaves a single row): a position's logits in a verify pass do
    not depend on how many positions the pass holds. Control: F.linear's one-row product (MKL's sgemv sums in
    another order) differs from the kernel's in some bits."""
    assert verify_linear.kernel() is not None, verify_linear.status()
    generator = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        most = verify_linear.DTYPES[dtype][1]
        for k, n in ((576, 199), (1536, 64), (45, 9)):
            w = torch.randn(n, k, generator=generator).to(dtype)
            b = torch.randn(n, generator=generator).to(dtype)
            for rows in (2, 3, 5, 8, 12, 13, 16, 24, 32):
                if rows > most:
                    continue
                x = torch.randn(rows, k, generator=generator).to(dtype)
                together = verify_linear.linear(x, w, b)
                alone = torch.cat([verify_linear.linear(x[i:i + 1], w, b, min_rows=1) for i in range(rows)])
                assert torch.equal(together, alone), (dtype, k, n, rows)
    x = torch.randn(1, 576, generator=generator)
    w = torch.randn(256, 576, generator=generator)
    assert not torch.equal(verify_linear.linear(x, w, min_rows=1), F.linear(x, w))


@needs_kernel
@pytest.mark.parametrize("arch,dtype", [("llama", torch.float32), ("qwen2", torch.float32), ("opt", torch.float32),
                                        ("llama", torch.bfloat16)])
def test_greedy_text_through_the_kernel_is_the_targets(kernel_env, monkeypatch, arch, dtype):
    target = build(arch, init=0.2).to(dtype)
    draft = perturbed(target, scale=0.5)
    ids = torch.tensor([[0, 5, 17, 33, 9]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=120, min_new_tokens=120)
    calls = {"kernel": 0}
    original = verify_linear.linear

    def counted(x, weight, bias=None, min_rows=verify_linear.MIN_ROWS):
        rows = x.numel() // weight.shape[1]
        calls["kernel"] += min_rows <= rows <= verify_linear.MAX_ROWS
        return original(x, weight, bias, min_rows)

    monkeypatch.setattr(verify_linear, "linear", counted)
    out = hfspec.generate(target, ids, draft=draft, gamma=4, temperature=0, max_new_tokens=120, min_new_tokens=120)
    if dtype == torch.float32:
        assert torch.equal(out.sequences, expected)
    else:  # bf16 greedy text may differ from generate's at near-ties, with or without the kernel: each difference
        # must be one the audit explains (the top two logits closer than bf16's rounding)
        report = check_greedy(target, draft, [ids], max_new_tokens=120, gamma=4, min_new_tokens=120)
        assert report.passed, report.lines()
    assert calls["kernel"] > 0, "the verify passes must have gone through the kernel"
    assert 0 < out.stats.accepted < out.stats.checked  # real rejections, so rollbacks were exercised too
    assert all("forward" not in m.__dict__ for m in target.modules()), "every linear restored after the decode"


@needs_kernel
def test_a_decode_through_the_kernel_records_its_verify_floor(kernel_env, monkeypatch):
    target = build("llama")
    draft = perturbed(target, 0.5)
    ids = torch.tensor([[0, 5, 17]])
    through = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=0, max_new_tokens=12)
    assert through.stats.verify_floor < 1.0
    monkeypatch.setenv(verify_linear.MODE_ENV, "off")  # the control: F.linear's passes are no cheaper than a step
    plain = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=0, max_new_tokens=12)
    assert plain.stats.verify_floor == 1.0


def test_linears_are_routed_only_inside_the_block(kernel_env):
    if _buildable():
        pytest.skip(_buildable())
    target = build("llama")
    linears = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    with verify_linear.installed(target) as routed:
        assert routed == len(linears) > 0
        assert all("forward" in m.__dict__ for m in linears)
        with verify_linear.installed(target) as inner:  # nested: the outer block owns them
            assert inner == 0
        assert all("forward" in m.__dict__ for m in linears)
    assert all("forward" not in m.__dict__ for m in linears)
    with verify_linear.installed(target.to(torch.bfloat16)) as routed:
        assert routed == len(linears)  # bf16 too
    with verify_linear.installed(target.to(torch.float16)) as routed:
        assert routed == 0  # fp16 keeps F.linear
    target.to(torch.float32)
    assert verify_linear.active_for(target)
    set_attr(target, BITWISE_VERIFY, True)  # `use_bitwise_verify`: passes must round as generate's own steps
    with verify_linear.installed(target) as routed:
        assert routed == 0 and not verify_linear.active_for(target)


def test_a_prepacked_target_keeps_its_own_path(kernel_env):
    if _buildable() or not fast_linear.available():
        pytest.skip(_buildable() or "no oneDNN prepacked linear in this torch")
    target = build("llama")
    fast_linear.prepack(target)
    with verify_linear.installed(target) as routed:
        assert routed == 0
    fast_linear.unprepack(target)


def test_off_and_a_bad_mode(kernel_env, monkeypatch):
    target = build("llama")
    monkeypatch.setenv(verify_linear.MODE_ENV, "off")
    with verify_linear.installed(target) as routed:
        assert routed == 0
    assert "off" in verify_linear.status()
    monkeypatch.setenv(verify_linear.MODE_ENV, "fast")
    with pytest.raises(HfspecError, match="HFSPEC_ROWS_KERNEL.*fast.*auto, on or off"):
        verify_linear.status()


def test_auto_wants_it_on_the_measured_kinds_and_stays_quiet_where_it_cannot_run(kernel_env, monkeypatch):
    monkeypatch.setenv(verify_linear.MODE_ENV, "auto")
    monkeypatch.setattr(verify_linear, "applies", lambda: "")
    wanted = {}
    for kind in ("avx512", "amx", "avx2"):
        monkeypatch.setenv("HFSPEC_CPU_KIND", kind)
        wanted[kind] = verify_linear.wanted()
    assert wanted == {"avx512": True, "amx": True, "avx2": True}  # the AVX2 EPYC runs its AVX2 body (7 December)
    # an ARM machine takes the "cpu" (avx512) rows too: auto leaves it to F.linear without building or warning
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx512")
    monkeypatch.setattr(verify_linear, "applies", lambda: "the few-row kernel is built for x86-64 Linux only, not x")
    assert not verify_linear.wanted()
    assert "off" in verify_linear.status()
    with verify_linear.installed(build("llama")) as routed:
        assert routed == 0
    assert verify_linear._built is None, "nothing was built"
    monkeypatch.setenv(verify_linear.MODE_ENV, "on")  # the control: asked for by name, it is wanted (and warned)
    assert verify_linear.wanted()


def test_a_compiler_that_fails_leaves_f_linear_and_no_file(kernel_env, monkeypatch, tmp_path):
    if _buildable():
        pytest.skip(_buildable())
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    assert verify_linear.kernel() is None
    assert "could not be built" in verify_linear.status() and "internal error" in verify_linear.status()
    assert not list(kernel_env.glob("*")), "a failed build leaves nothing behind"
    target = build("llama")
    with pytest.warns(RuntimeWarning, match="verify passes keep F.linear.*internal error"):
        with verify_linear.installed(target) as routed:
            assert routed == 0
    expected = target.generate(torch.tensor([[0, 5, 17]]), do_sample=False, max_new_tokens=20)
    out = hfspec.generate(target, torch.tensor([[0, 5, 17]]), draft=perturbed(target, 0.5), gamma=3, temperature=0,
                          max_new_tokens=20)
    assert torch.equal(out.sequences, expected)


def test_an_unusable_folder_is_reported_and_left_alone(kernel_env, monkeypatch, tmp_path):
    if _buildable():
        pytest.skip(_buildable())
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    monkeypatch.setenv(verify_linear.KERNEL_DIR_ENV, str(blocker))
    assert verify_linear.kernel() is None
    assert "could not be built" in verify_linear.status()
    assert blocker.read_text() == "mine"


@needs_kernel
def test_a_damaged_library_is_rebuilt(kernel_env):
    # built but not loaded by this process (a loaded path would be served from memory), then cut short, as a
    # copy or a disk that filled up would leave it
    library = verify_linear._library(verify_linear._compiler(), verify_linear._flags())
    library.write_bytes(library.read_bytes()[:100])
    assert verify_linear.kernel() is not None, verify_linear.status()
    assert library.stat().st_size > 100
    x, w = torch.randn(3, 40), torch.randn(50, 40)
    torch.testing.assert_close(verify_linear.linear(x, w), F.linear(x, w), rtol=1e-4, atol=1e-4)


def test_the_session_says_what_the_verify_passes_run(kernel_env, monkeypatch):
    """Loading a target says which path its verify passes take (the CLI's and the dashboard's progress line);
    with the kernel off nothing is said (control)."""
    from hfspec.session import Session

    if _buildable():
        pytest.skip(_buildable())
    lines = []
    Session().load_target(MICRO, progress=lines.append)
    assert any(line.startswith("verify passes: few-row kernel") for line in lines), lines
    monkeypatch.setenv(verify_linear.MODE_ENV, "off")
    lines.clear()
    Session().load_target(MICRO, progress=lines.append)
    assert lines and not any("verify passes" in line for line in lines), lines
