"""Checks after a load: the model is exactly its checkpoint, and a dequantised GGUF model is plain."""

from __future__ import annotations

import threading

from hfspec.errors import HfspecError

_LOAD_LOCK = threading.RLock()  # held around every from_pretrained of load_model (see check_loaded)
_RACE = (
    "another thread was probably loading a model with transformers at the same time (its loading is not "
    "thread-safe); allowed: one load at a time (hfspec's load_model serialises its own; restart the process "
    "if loads outside hfspec overlapped)"
)


def check_loaded(model, info: dict, role: str, where: str, ignore_mismatched: bool = False) -> None:
    """Refuse a model that is not exactly its checkpoint: weights the config expects but the files lack (they
    would be random), weights the files hold but the config has no place for, shape mismatches, parameters
    left on the meta device, and tied weights that are not tied. The last two happen when two threads load at
    once (transformers replaces `PreTrainedModel.tie_weights` while loading), which `_LOAD_LOCK` prevents
    for hfspec's own loads."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    untied = sorted(set(info.get("missing_keys") or ()) & set(tied))  # tying skipped: reported as missing
    if untied:
        raise HfspecError(
            f"{role}: tensor {untied[0]} of {where!r} should be tied to {tied[untied[0]]} but was not tied while "
            f"loading; {_RACE}"
        )
    problems = [
        ("missing from the weight files (it would be random)", sorted(info.get("missing_keys") or ())),
        ("in the weight files but not in the model config", sorted(info.get("unexpected_keys") or ())),
        ("of a different shape in the weight files", [] if ignore_mismatched else
         [f"{k} {tuple(a)} vs {tuple(b)}" for k, a, b in sorted(info.get("mismatched_keys") or ())]),
        ("not loadable", list(info.get("error_msgs") or ())),
    ]
    for what, names in problems:
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise HfspecError(
                f"{role}: tensor {shown} {what}; config.json of {where!r} does not match its weights; "
                "allowed: a config.json that describes the weights (layers, sizes, vocabulary)"
            )
    hooked = [name for name, module in model.named_modules() if hasattr(module, "_hf_hook")]  # accelerate
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta and not any(h == "" or name.startswith(h + ".") for h in hooked):
            raise HfspecError(f"{role}: tensor {name} of {where!r} was left on the meta device (never loaded); {_RACE}")
    for name, source in tied.items():
        try:
            a, b = model.get_parameter(name), model.get_parameter(source)
        except AttributeError:
            continue
        if a is not b and not a.is_meta and not b.is_meta and a.data_ptr() != b.data_ptr():
            raise HfspecError(
                f"{role}: tensor {name} of {where!r} should be tied to {source} but is a separate tensor; {_RACE}"
            )




def drop_gguf_quantizer(model):
    """transformers dequantises GGUF weights into ordinary tensors but leaves a GGUF "quantizer" attached,
    which makes ``.half()``/``.float()`` refuse and would be saved into config.json. The model is a plain
    dense model, so detach it."""
    from transformers import PreTrainedModel

    config = getattr(model, "config", None)
    qc = getattr(config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if str(getattr(method, "value", method)).lower() != "gguf":
        return
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)  # hf_quantizer, config entry, quantization_method, ...
    for name in ("hf_quantizer", "quantization_method"):
        model.__dict__.pop(name, None)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    model.is_quantized = False
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and getattr(module.config, "_is_quantized", False):
            module.config._is_quantized = False

