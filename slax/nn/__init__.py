"""Slang MLP layers as JAX primitives (see slax/nn/_mlp.py and shaders/nn/mlp.slang), and instant-NGP's
multiresolution hash encoding (slax/nn/_hash_encoding.py and shaders/nn/hash_encoding.slang)."""

from slax.nn._hash_encoding import (
    HashEncodingConfig,
    hash_encode,
    hash_encode_with_jacobian,
    hash_encoding_init,
    hash_field_with_gradient,
)
from slax.nn._hash_reference import hash_encode_reference
from slax.nn._mlp import Params, describe, mlp_apply, mlp_init, mlp_loss_and_grad, mlp_squared_error
from slax.nn._params import MLPParams
from slax.nn._reference import mlp_apply_reference, mlp_loss_reference

__all__ = [
    "HashEncodingConfig",
    "MLPParams",
    "Params",
    "describe",
    "hash_encode",
    "hash_encode_reference",
    "hash_encode_with_jacobian",
    "hash_encoding_init",
    "hash_field_with_gradient",
    "mlp_apply",
    "mlp_apply_reference",
    "mlp_init",
    "mlp_loss_and_grad",
    "mlp_loss_reference",
    "mlp_squared_error",
]
