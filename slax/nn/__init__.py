"""Slang MLP layers as JAX primitives (see slax/nn/_mlp.py and shaders/nn/mlp.slang)."""

from slax.nn._mlp import Params, describe, mlp_apply, mlp_init, mlp_loss_and_grad
from slax.nn._params import MLPParams
from slax.nn._reference import mlp_apply_reference, mlp_loss_reference

__all__ = [
    "MLPParams",
    "Params",
    "describe",
    "mlp_apply",
    "mlp_apply_reference",
    "mlp_init",
    "mlp_loss_and_grad",
    "mlp_loss_reference",
]
