"""instant-NGP's model as ngp_image.py and ngp_sdf.py train it: the multiresolution hash encoding
(``slax.nn.hash_encode``) feeding a ReLU MLP with two hidden layers of 64, slax's or its plain-JAX
twin (``hash_encode_reference``, ``mlp_apply_reference``), and their parameters. Their flags are
``_harness.add_hash_encoding_arguments``.

Precision: the tables are float32 in both dtypes (``hash_encode`` reads and updates float32, as
instant-NGP keeps its grid). With ``--dtype float16`` the encoding's features are float16 and the
MLP runs in float16 on a half copy (``_training.cast``) of float32 parameters, as sdf.py's and
image.py's float16 runs do: Adam updates float32 numbers, whose small steps half precision would
round away. slax's encoding gives float16 features itself (``hash_encode``'s ``dtype``, as
tiny-cuda-nn's encodings give the network's precision); the plain-JAX twin casts its float32
features, so both models are the same computation (rounded once against twice). The model's output
comes back as float32, so each loss is float32's.

Imports JAX and slax: a script imports it after parsing its flags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from _training import PARTS, cast, keeps_parameters_flat

from slax import nn

HIDDEN = (64, 64)
"""The MLP's hidden widths (the issue's 32-64-64-n with the default 16 levels of 2 features)."""
COARSEST_RESOLUTION = 16
"""The coarsest level's cells per axis (the paper's N_min)."""


def encoding_config(
    levels: int, log2_table_size: int, dimensions: int, finest_resolution: int
) -> nn.HashEncodingConfig:
    """The encoding of ``levels`` levels of 2 features, ``2^log2_table_size`` entries each (the
    scripts' ``--levels`` and ``--log2-table-size``), in ``dimensions``, with resolutions from
    :data:`COARSEST_RESOLUTION` to ``finest_resolution``."""
    return nn.HashEncodingConfig(
        dimensions=dimensions,
        levels=levels,
        log2_table_size=log2_table_size,
        coarsest_resolution=COARSEST_RESOLUTION,
        finest_resolution=finest_resolution,
    )


def mlp_sizes(config: nn.HashEncodingConfig, outputs: int) -> tuple[int, ...]:
    """The MLP's widths: the encoding's features, :data:`HIDDEN`, ``outputs``."""
    return (config.output_features, *HIDDEN, outputs)


def init_params(key: jax.Array, config: nn.HashEncodingConfig, outputs: int) -> dict[str, Any]:
    """``{"tables", "mlp"}``: the paper's initial tables and a ReLU MLP of :func:`mlp_sizes`, both
    float32 whatever the run's dtype (the casts are :func:`model`'s)."""
    table_key, mlp_key = jax.random.split(key)
    return {
        "tables": nn.hash_encoding_init(table_key, config),
        "mlp": nn.mlp_init(mlp_key, mlp_sizes(config, outputs), activation="relu"),
    }


def network(name: str, dtype: Any) -> Callable[[Any, jax.Array], jax.Array]:
    """``(mlp params, features) -> float32 (..., outputs)``: slax's (``"slax"``) or plain JAX's
    (``"jax"``) MLP, run in ``dtype`` on a cast of its float32 parameters and of the features (see
    the module's docstring)."""
    apply = nn.mlp_apply if name == "slax" else nn.mlp_apply_reference

    def run(params, features):
        return apply(*cast((params, features), dtype)).astype(jnp.float32)

    return run


def encoder(name: str, config: nn.HashEncodingConfig, dtype: Any) -> Callable[..., jax.Array]:
    """``(tables, x) -> features``: slax's encoding from the float32 tables (its features in
    ``dtype``), or plain JAX's (float32, which :func:`network` casts)."""

    def encode(tables, x):
        if name == "slax":
            return nn.hash_encode(tables, x, config, dtype=dtype)
        return nn.hash_encode_reference(tables, x, config)

    return encode


def model(name: str, config: nn.HashEncodingConfig, dtype: Any) -> Callable[[Any, jax.Array], jax.Array]:
    """``(params, x (..., d) in [0, 1]^d) -> float32 (..., outputs)`` of ``"slax"`` or of plain
    ``"jax"``: :func:`encoder`'s features, then :func:`network`."""
    run, encode = network(name, dtype), encoder(name, config, dtype)

    def predict(params, x):
        return run(params["mlp"], encode(params["tables"], x))

    return predict


def squared_error(name: str, config: nn.HashEncodingConfig, dtype: Any) -> Callable[..., jax.Array]:
    """``(params, x (..., d), target (..., outputs) float32) -> float32``: the mean squared error
    of :func:`model`'s outputs, over samples and outputs, against the target rounded to the MLP's
    dtype in both models (as ``slax.nn.mlp_squared_error`` takes it). slax's is
    ``mlp_squared_error`` on the encoding's features, whose gradient runs the network's forward
    pass, the loss and both gradients in one launch where the warp tiles run it; plain JAX's the
    twin's outputs minus the target."""
    if name == "slax":
        encode = encoder(name, config, dtype)

        def loss(params, x, target):
            features = encode(params["tables"], x)
            mlp = cast(params["mlp"], dtype)
            return nn.mlp_squared_error(mlp, features, target.astype(dtype)) / target.shape[-1]

        return loss
    predict = model(name, config, dtype)

    def twin_loss(params, x, target):
        return jnp.mean((predict(params, x) - target.astype(dtype).astype(jnp.float32)) ** 2)

    return twin_loss


def kept_flat(name: str) -> bool | str:
    """How the scripts keep model ``name``'s parameters (``_training.parameter_state``'s ``flat``):
    slax's tables and MLP each as one vector (``PARTS``: the MLP's the kernels' own layout), plain
    JAX's as arrays."""
    return PARTS if keeps_parameters_flat(name) else False


def optimizer(lr: float, steps: int) -> optax.GradientTransformation:
    """The scripts' Adam, on the tables and the MLP together: ``lr`` cosine-decayed over ``steps``
    to a hundredth of it, with instant-NGP's epsilon, 1e-15."""
    return optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.01), eps=1e-15)


def encoding_metrics(config: nn.HashEncodingConfig, dtype: str) -> dict[str, Any]:
    """The encoding and the precision of each part, as metrics.json records them."""
    return {
        "levels": config.levels,
        "features_per_level": config.features_per_level,
        "log2_table_size": config.log2_table_size,
        "resolutions": config.resolutions,
        "dense_levels": config.dense_levels,
        "table_rows": config.table_rows,
        "tables_dtype": "float32",
        "mlp_dtype": dtype,
    }
