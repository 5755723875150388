"""Group-wise RTN quantisation: tensor functions (groupwise), packed storage (packing), modules, module swap."""

from hfspec.quant.groupwise import group_dequantize, group_qparams, group_quantize
from hfspec.quant.modules import QuantEmbedding, QuantLinear, QuantWeight
from hfspec.quant.packing import int4_cpu_kernel_ok, pack_rows, packed_row_bytes, unpack_rows
from hfspec.quant.swap import describe, quantize_model, summary, weight_matrices

__all__ = [
    "QuantEmbedding",
    "QuantLinear",
    "QuantWeight",
    "describe",
    "group_dequantize",
    "group_qparams",
    "group_quantize",
    "int4_cpu_kernel_ok",
    "pack_rows",
    "packed_row_bytes",
    "quantize_model",
    "summary",
    "unpack_rows",
    "weight_matrices",
]
