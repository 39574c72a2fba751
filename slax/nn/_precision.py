"""How a float32 network's matrix products run, by JAX's own precision rules.

slax does not choose the precision for the user: a call takes its ``precision=`` argument, else
JAX's default for the trace (``jax.default_matmul_precision(...)``, the
``jax_default_matmul_precision`` config or its ``JAX_DEFAULT_MATMUL_PRECISION`` variable), as
``jnp.matmul`` does. On GPUs with tensor cores XLA runs float32 products at ``DEFAULT`` and
``HIGH`` as one TF32 pass (10 bits of each operand's significand, float32 sums) and at ``HIGHEST``
at float32's accuracy; slax's kernels do the same (:class:`Float32Products`). Where no tensor cores
run (the CPU routes, the SIMT kernels) every float32 product is float32's, as XLA's are there. A
float16 network's products are exact at every precision (half values are TF32 values), summed in
float32.
"""

from __future__ import annotations

import enum
from typing import Any

import jax

Precision = jax.lax.Precision
Preset = jax.lax.DotAlgorithmPreset


class Float32Products(enum.Enum):
    """How a float32 network's products run on tensor cores."""

    TF32 = "TF32"
    """One TF32 pass (``mma.sync`` on TF32 operands, float32 sums), about 2^-11 relative: XLA's
    ``DEFAULT`` and ``HIGH`` on these GPUs."""
    FLOAT32 = "3xTF32"
    """Float32's accuracy: each operand split into two TF32 parts, three passes (CUTLASS's
    "3xTF32"), within a few ulps of float32 products: XLA's ``HIGHEST``."""


TF32_PRESETS = (Preset.DEFAULT, Preset.TF32_TF32_F32)
FLOAT32_PRESETS = (Preset.TF32_TF32_F32_X3, Preset.F32_F32_F32)


def float32_products(function: str, precision: Any = None) -> Float32Products:
    """The products a call of ``slax.nn.<function>`` runs for ``precision``: a ``lax.Precision``,
    one of the strings JAX accepts for it (``"default"``, ``"high"``, ``"highest"``,
    ``"bfloat16"``, ``"tensorfloat32"``, ``"float32"``, ``"fastest"``), a pair of those (one per
    operand: the higher rules, as in XLA), a TF32 or float32 ``lax.DotAlgorithmPreset`` or its
    name; ``None``: JAX's default matmul precision as the call is traced.

    Raises:
      ValueError: a precision that names products the kernels do not run (bfloat16 or float8
        algorithms, float64), or no precision at all.
    """
    given = precision
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
        if precision is None:
            return Float32Products.TF32
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        products = [_one(function, given, p) for p in precision]
        return Float32Products.FLOAT32 if Float32Products.FLOAT32 in products else Float32Products.TF32
    return _one(function, given, precision)


def _one(function: str, given: Any, value: Any) -> Float32Products:
    precision = value
    if isinstance(precision, str):
        try:
            precision = Precision(precision)
        except ValueError:
            precision = Preset.__members__.get(precision, precision)
    if isinstance(precision, Precision):
        return Float32Products.FLOAT32 if precision == Precision.HIGHEST else Float32Products.TF32
    if precision in TF32_PRESETS:
        return Float32Products.TF32
    if precision in FLOAT32_PRESETS:
        return Float32Products.FLOAT32
    source = (
        "precision" if given is not None else "JAX's default matmul precision (jax_default_matmul_precision)"
    )
    raise ValueError(
        f"slax.nn.{function}: {source} is {value!r}, which the MLP's kernels do not run. They "
        "take lax.Precision.DEFAULT, HIGH or HIGHEST, the strings JAX accepts for them ('default', "
        "'high', 'highest', 'bfloat16', 'tensorfloat32', 'float32', 'fastest'), or the algorithm "
        f"presets {', '.join(p.name for p in TF32_PRESETS + FLOAT32_PRESETS)}."
    )


def twin_precision(dtype: str, products: Float32Products) -> Precision:
    """The ``precision`` of XLA's products in the plain-JAX twins (slax/nn/_reference.py) that
    stand for a kernel: a float32 network's as the call asked (``DEFAULT``: TF32 on tensor cores,
    float32 elsewhere; ``HIGHEST``), a float16 network's ``DEFAULT``, which holds half values
    exactly."""
    if dtype == "float32" and products is Float32Products.FLOAT32:
        return Precision.HIGHEST
    return Precision.DEFAULT
