"""What goes in and out of hfspec: loading a target or draft and its tokenizer (`hfspec.io.loading`), whether it
fits in memory, exporting a draft as a compressed-tensors checkpoint, and the named demo presets.

    loading/        sources (folder, .gguf, hub id), placement (dtype, device), checks, progress, errors
    memory          will a model fit, from its checkpoint, before anything is allocated
    pack_quantized  compressed-tensors' pack-quantized layout
    export_draft    save an RTN draft as a standard quantised checkpoint
    presets         named, ready-to-run demo configurations (presets/*.toml)

io never imports the decoding loop, the measurement harness, the session or the front ends.
"""
