"""How a model's forward runs, below the drafts and the loop: the HF forward with its KV cache and the slot layout
both models share, the lean and compiled draft steps, and fast linear paths.

    cache        the one place that talks to Hugging Face's KV-cache API
    kv_model     a model with its KV cache (`CachedModel`): feed what it has not seen, roll back on rejection
    slots        token, position and validity per slot, for the rows still running
    lean_layers  the lean step's layers (RTN codes or float weights)
    lean         the lean decode step for drafts built from the target's weights (`LeanDecoder`, `LeanRunner`)
    compiled     an optional `torch.compile`d one-token lean step (`rtn4-compiled`)
    fast_linear  oneDNN-prepacked fp32 weights for the verify pass
    verify_linear  the few-row kernel: a verify pass's fp32 and bf16 linears reading each weight row once

Kernels import `hfspec.quant` and the base modules (errors, validate) only, never drafts, decoding or above.
"""
