"""The native step: a lean decoder's layers over a few new tokens in one C call (`lean_step.c`'s
`hfspec_lean_layers`, built into the verify kernel's library), instead of a compiled or eager graph: a 4-bit lean
draft's steps, and the lean target's passes (`hfspec.kernels.lean_target`: the target's own fp32 weights).

Why: a draft step of SmolLM2-135M reads 121 int4 matrices. Their products through hfspec's int4 kernel took 3.9 ms
on the 2-core Intel Xeon without AMX, the compiled step (inductor, C++ wrapper, torch's int4 kernel) 6.7 ms and the
eager lean step 10.3 ms: the rest is the per-operator cost of a few hundred small kernels and, compiled, torch's
slower int4 kernel (`hfspec.kernels.int4_rows`). The lean target's pass had the same overhead around its products:
through this step one position costs 0.52 of the HF forward's one-token step, five 0.65, against 0.84 and 0.97
without it (`benchmarks/bench_verify_width.py --dtypes float32+lean`). In C a layer is a few kernel calls and
loops over the hidden size.

Used by `LeanDecoder.logits` for feeds at consecutive positions (a draft's 1..`MAX_ROWS` tokens, the lean target's
`TARGET_ROWS`), batch 1, no padding mask, and by `hfspec.decoding.tree_forward.forward_level` for a token tree's
level (explicit positions, a mask of the slots each node sees); prompts and batches keep the other paths; all write
the same cache, in the same layout. Runs where every decoder matrix is int4 through hfspec's int4 kernel (rtn2-4
and calibrated 4-bit drafts, any head) or the target's own contiguous fp32 tensor, and the layer is one this C
reproduces: RMSNorm before attention and MLP, no q/k norm, no sandwich norms, one rotary type, no sliding window,
SiLU or GeLU. The input embedding, the final norm and the head (with a draft's re-scored top logits) stay in torch.
On an AVX2-only CPU the library builds with the C's AVX2 bodies (fp32 products, and int4 products in torch's AVX2
layout, blocks of 32 rows), so both a 4-bit draft's steps and the lean target's passes run here there too.

Checked against the eager lean step when first used (one-token steps and a two-token feed after an eagerly fed
prompt; logits within `TOLERANCE` of their scale); where it is off, cannot be built, or disagrees, the other paths
run and `path_of` says why. `$HFSPEC_NATIVE_STEP`: "auto" (the default) and "on" use it where it builds and checks,
"off" never. A draft's q is the same deterministic function of the context whichever path computes it in a run, and
a proposal: the output law does not depend on it; the lean target's logits are also checked against the HF forward's
(`hfspec.kernels.lean_target`).
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import torch

from hfspec.kernels import int4_rows, verify_linear
from hfspec.kernels.lean_layers import _activation_name
from hfspec.kernels.shared_linear import SharedLinear

MODE_ENV = "HFSPEC_NATIVE_STEP"
FUNCTION = "hfspec_lean_layers"
MAX_ROWS = 16  # a draft's feeds and token-tree levels of up to this many tokens run as one call
TARGET_ROWS = (1, 16)  # the lean target's passes of this many positions
MATS = 7  # lean_step.c's matrices per layer: q (or a fused qkv), k, v, o, gate (or a fused gate/up), up, down
PTRS_PER_LAYER = 3 * MATS + 2  # (weight or packed codes, scales_and_zeros, bias) per matrix; two norms
HEADER = 16
KIND_INT4, KIND_F32 = 0, 1
ROT_PAIRS, ROT_HALVES = 0, 1  # a draft's rows permuted for pairs side by side; the target's own (rotate-half)
ACTS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_new": 1, "gelu": 2}
TOLERANCE = 1e-4  # of the logits' scale: float summation order only (the products are the same kernel's)
CHECK_IDS = (1, 7, 3, 11, 5, 2, 9, 4)
# decoder -> (native step or None, what runs or why not): beside the decoder, not in it (a deep copy of a decoder
# must not copy ctypes pointers into the original's memory)
_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.RLock()


def mode() -> str:
    """`$HFSPEC_NATIVE_STEP` ("auto" when unset; another value refused by name)."""
    return verify_linear.mode(MODE_ENV)


def why_not(decoder) -> str | None:
    """None when `decoder` (a `LeanDecoder`) can take the native step; otherwise why not."""
    if mode() == "off":
        return f"{MODE_ENV}=off"
    config = decoder.config.get_text_config() if hasattr(decoder.config, "get_text_config") else decoder.config
    act = _activation_name(config)
    if act not in ACTS:
        return f"activation {act!r}"
    if len(decoder.rope_types) != 1:
        return "more than one rotary type"
    for i, block in enumerate(decoder.blocks):
        if block.qk_norm is not None or block.attn_out_norm is not None or block.mlp_out_norm is not None:
            return f"layer {i}: q/k or sandwich norms"
        if block.window is not None:
            return f"layer {i}: a sliding window"
        if block.mlp_in_norm is None or block.in_norm is None:
            return f"layer {i}: a layer without its two norms"
        for lin in block.linears():
            if _matrices(lin) is None:
                return f"layer {i}: a matrix that is neither int4 nor the target's own fp32 ({lin.path})"
    if any(getattr(lin, "int4", False) for block in decoder.blocks for lin in block.linears()) and (
            int4_rows.function() is None):
        return int4_rows.status()
    return None


def _matrices(lin) -> list[tuple] | None:
    """[(kind, weight or packed codes, scales_and_zeros or None, bias or None, n, k, group)] of a lean matrix's
    parts, or None where the C cannot read it: an int4 `LeanLinear`, or the lean target's `SharedLinear` parts
    (the target's own fp32 tensors, contiguous)."""
    if isinstance(lin, SharedLinear):
        if not all(w.dtype == torch.float32 and w.is_contiguous() and (b is None or (b.dtype == torch.float32 and
                   b.is_contiguous())) for w, b in lin.parts):
            return None
        return [(KIND_F32, w, None, b, w.shape[0], w.shape[1], 0) for w, b in lin.parts]
    if getattr(lin, "int4", False):
        if not (lin.packed.dtype == torch.uint8 and lin.scales_and_zeros.dtype == torch.bfloat16
                and lin.packed.is_contiguous() and lin.scales_and_zeros.is_contiguous()
                and (lin.bias is None or (lin.bias.dtype == torch.float32 and lin.bias.is_contiguous()))):
            return None
        return [(KIND_INT4, lin.packed, lin.scales_and_zeros, lin.bias, lin.out_features, lin.in_features,
                 lin.group_size)]
    return None


class NativeStep:
    """`decoder`'s layers through `lean_step.c`; call as `step(input_ids [1, T], start, cache)` -> h [1, T, hidden]."""

    def __init__(self, decoder, fn) -> None:
        self._decoder, self.fn = weakref.ref(decoder), fn  # weak: `_STATE`'s value must not keep its key alive
        blocks = decoder.blocks
        first = blocks[0]
        config = decoder.config.get_text_config() if hasattr(decoder.config, "get_text_config") else decoder.config
        self.header = [len(blocks), decoder.hidden, first.heads, first.kv_heads, first.head_dim, first.rot, first.inter,
                       0, 0, ACTS[_activation_name(config)], 0] + [0] * (HEADER - 11)
        matrices, tensors = [], []
        for block in blocks:
            if (block.heads, block.kv_heads, block.head_dim, block.rot, block.inter) != tuple(self.header[2:7]):
                raise ValueError("native step: layers of different shapes")
            qkv, o, gate_up, down = (_matrices(lin) for lin in block.linears())
            slots = _padded(qkv, 3) + o + _padded(gate_up, 2) + down
            for kind, w, sz, b, n, k, group in slots:
                tensors += [w, sz, b]
                matrices += [kind, n, k, group]
            tensors += [block.in_norm.float().contiguous(), block.mlp_in_norm.float().contiguous()]
        self.header[11] = ROT_HALVES if first.order is not None else ROT_PAIRS
        self.rows = TARGET_ROWS if first.order is not None else (1, MAX_ROWS)
        self.eps, self.scaling = float(first.eps), float(first.scaling)
        if any(block.eps != first.eps or block.scaling != first.scaling for block in blocks):
            raise ValueError("native step: layers with different eps or scaling")
        self._tensors = tensors  # kept alive: the C reads them through `self._ptrs`
        self._ptrs = (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])
        self._matrices = matrices
        self._first = _matrices(first.qkv)[0][1]

    @property
    def decoder(self):
        return self._decoder()

    def takes(self, steps: int) -> bool:
        """Whether a feed of `steps` tokens runs here (a draft's 1..MAX_ROWS, the lean target's TARGET_ROWS)."""
        return self.rows[0] <= steps <= self.rows[1]

    def stale(self) -> bool:
        """Whether the decoder's weights were replaced since this step read their addresses."""
        now = _matrices(self.decoder.blocks[0].qkv)
        return now is None or now[0][1] is not self._first

    def __call__(self, input_ids: torch.Tensor, start: int, cache, positions: torch.Tensor | None = None,
                 seen: torch.Tensor | None = None) -> torch.Tensor:
        """h [1, T, hidden] after the last layer for input_ids [1, T] written at cache slots start..start+T-1, at
        positions start.. (or `positions` [T]), each attending to the slots before it (or to those row i of `seen`
        [T, start + T] marks: a token tree's level)."""
        steps = input_ids.shape[1]
        end = start + steps
        cache.reserve(1, end)
        decoder = self.decoder
        h = torch.nn.functional.embedding(input_ids.view(-1), decoder.embed_table).float()
        if decoder.embed_scale is not None:
            h = h * decoder.embed_scale
        h = h.contiguous()
        if positions is None:
            rope = decoder._table(decoder.rope_types[0], end)[start:end].contiguous()
        else:
            rope = decoder._table(decoder.rope_types[0], int(positions.max()) + 1)[positions.view(-1)].contiguous()
        if seen is not None:
            if tuple(seen.shape) != (steps, end):
                raise ValueError(f"native step: a mask of shape {tuple(seen.shape)} for {steps} rows over {end} slots")
            seen = seen.to(torch.uint8).contiguous()
        keys, values = cache.keys, cache.values
        if not all(t.is_contiguous() and t.dtype == torch.float32 for t in keys + values):
            raise ValueError("native step: a cache that is not contiguous fp32")
        dims = (ctypes.c_int64 * (HEADER + len(self._matrices)))(
            *self.header[:7], keys[0].shape[2], start, self.header[9], steps, *self.header[11:], *self._matrices)
        kp = (ctypes.c_void_p * len(keys))(*[t.data_ptr() for t in keys])
        vp = (ctypes.c_void_p * len(values))(*[t.data_ptr() for t in values])
        status = self.fn(h.data_ptr(), dims, self._ptrs, rope.data_ptr(), kp, vp,
                         None if seen is None else seen.data_ptr(), self.eps, self.scaling, torch.get_num_threads())
        if status:
            raise RuntimeError(f"native step failed (status {status}) at slots {start}..{end - 1}")
        cache.length = end
        return h.view(1, steps, -1)


def _padded(parts: list[tuple], slots: int) -> list[tuple]:
    """A fused matrix in the first of `slots` places, unused ones (n = 0) after it."""
    return parts + [(KIND_F32, None, None, None, 0, 0, 0)] * (slots - len(parts))


def of(decoder) -> NativeStep | None:
    """`decoder`'s native step, built and checked on first use (and again after its weights were replaced); None
    where it is off or does not run (`path_of` says why)."""
    if mode() == "off" or int4_rows.held():  # within `int4_rows.as_compiled`: what a compiled step is checked against
        return None
    state = _STATE.get(decoder)
    if state is None or (state[0] is not None and state[0].stale()):
        with _lock:
            state = _STATE.get(decoder)
            if state is None or (state[0] is not None and state[0].stale()):
                state = build(decoder)
                _STATE[decoder] = state
    return state[0]


def path_of(decoder) -> str:
    """What runs `decoder`'s short feeds: the native step, or why not."""
    if mode() == "off":
        return f"not the native step ({MODE_ENV}=off)"
    step = of(decoder)
    return _STATE[decoder][1] if step is not None else f"not the native step ({_STATE[decoder][1]})"


def build(decoder) -> tuple[NativeStep | None, str]:
    """(the native step of `decoder`, what runs) or (None, why not): built and checked against the eager step."""
    why = why_not(decoder)
    if why:
        return None, why
    loaded, where = verify_linear.load_library()
    if loaded is None:
        return None, where
    try:
        fn = getattr(loaded, FUNCTION)
    except AttributeError:
        return None, f"{where} has no {FUNCTION}"
    fn.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_float, ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    try:
        step = NativeStep(decoder, fn)
        wrong = _check(decoder, step)
    except (ValueError, RuntimeError) as error:
        return None, str(error)
    if wrong:
        return None, f"the native step disagrees with the eager lean step ({wrong})"
    return step, f"native C step ({where})"


def _check(decoder, step: NativeStep) -> str:
    """'' when the native step's logits match the eager lean step's (`LeanDecoder.logits(native=False)`: neither
    native nor compiled) over one-token steps and feeds of 2 after an eagerly fed prompt, which both caches hold
    alike: a native step that wrote or read the cache in another layout would attend to the prompt wrongly.
    Else what differed."""
    ids = torch.tensor([CHECK_IDS]) % decoder.vocab
    eager, native = decoder.hfspec_new_cache(), decoder.hfspec_new_cache()
    with torch.no_grad():
        decoder.logits(ids[:, :4], None, None, eager, 0, native=False)
        decoder.logits(ids[:, :4], None, None, native, 0, native=False)
        for start, end in ((4, 5), (5, 7), (7, 8)):
            want = decoder.logits(ids[:, start:end], None, None, eager, 0, native=False)
            got = decoder._logits_of(step(ids[:, start:end], start, native))
            scale = want.abs().max().item() + 1e-6
            off = (got - want).abs().max().item()
            if not off <= TOLERANCE * scale:
                return f"tokens {start}..{end - 1}: logits off by {off:.2e} at a scale of {scale:.2f}"
    return ""
