"""What a user does right after installing the slang-jax wheel, run from outside the repository.

scripts/check-wheel.sh builds the wheel, installs it into a fresh virtual environment and runs this
file there from an empty temporary directory, so that nothing of the checkout (its shaders/, its
slax/) can stand in for what the wheel ships. Checks, each against plain JAX or NumPy at float32
tolerance (~1e-5 relative):

- the user's own ``.slang`` file, in the working directory: value, ``jax.grad``, ``jax.jvp``;
- a module written as SlangPy's documentation writes them (``import slangpy;``);
- ``slax.load_module("poly")``, shipped with slax;
- ``slax.nn.mlp_apply`` and ``slax.nn.mlp_loss_and_grad``, whose kernels import slax's Slang MLP.

Prints each check and a line counting them; exits 1 if any fails (a check that raises, as a Slang
compile error does, ends the run there with its traceback).
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import slax
from slax import nn

USER_MODULE = """
[Differentiable]
float soft_clip(float x, float limit)
{
    return limit * tanh(x / limit);
}
"""

SLANGPY_STYLE_MODULE = """
import slangpy;

[Differentiable]
float hashed_offset_square(float x, uint seed)
{
    return x * x + float(wang_hash(seed) & 255u) / 256.0;
}
"""

RTOL, ATOL = 1e-5, 1e-6
"""float32 results against float32 references: a few ulps."""


def close(got, want) -> bool:
    return bool(np.allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL))


def user_module_checks() -> dict[str, bool]:
    pathlib.Path("my_kernels.slang").write_text(USER_MODULE)
    soft_clip = slax.load_module("my_kernels.slang").soft_clip  # found in the working directory
    x = jnp.linspace(-3.0, 3.0, 101, dtype=jnp.float32)
    _, tangent = jax.jvp(lambda v: soft_clip(v, 2.0), (x,), (jnp.ones_like(x),))
    slope = 1 - jnp.tanh(x / 2) ** 2
    return {
        "own .slang file: value": close(soft_clip(x, 2.0), 2 * jnp.tanh(x / 2)),
        "own .slang file: jax.grad": close(jax.grad(lambda v: soft_clip(v, 2.0).sum())(x), slope),
        "own .slang file: jax.jvp": close(tangent, slope),
    }


def slangpy_style_checks() -> dict[str, bool]:
    pathlib.Path("slangpy_style.slang").write_text(SLANGPY_STYLE_MODULE)
    function = slax.load_module("slangpy_style.slang").hashed_offset_square
    x = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32)
    seed = jnp.arange(64, dtype=jnp.uint32)
    return {"import slangpy; module: jax.grad": close(jax.grad(lambda v: function(v, seed).sum())(x), 2 * x)}


def shipped_module_checks() -> dict[str, bool]:
    polynomial = slax.load_module("poly").polynomial
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    return {
        'load_module("poly"): value': close(polynomial(2.0, 8.0, -1.0, x), [9, 23, 41, 63]),
        'load_module("poly"): jax.grad': close(
            jax.grad(lambda v: polynomial(2.0, 8.0, -1.0, v).sum())(x), [12, 16, 20, 24]
        ),
    }


def mlp_checks() -> dict[str, bool]:
    keys = jax.random.split(jax.random.key(0), 3)
    params = nn.mlp_init(keys[0], (4, 16, 4), jnp.float32)
    x = jax.random.uniform(keys[1], (256, 4), minval=-1, maxval=1)
    target = jax.random.uniform(keys[2], (256, 4), minval=-1, maxval=1)
    loss_ref, grads_ref = jax.value_and_grad(nn.mlp_loss_reference)(params, x, target)
    y_ref = nn.mlp_apply_reference(params, x)  # the references multiply at full float32
    loss, grads = nn.mlp_loss_and_grad(params, x, target)
    return {
        "nn.mlp_apply": close(nn.mlp_apply(params, x), y_ref),
        "nn.mlp_loss_and_grad: loss": close(loss, loss_ref),
        "nn.mlp_loss_and_grad: grads": all(
            close(g, r) for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref))
        ),
    }


def main() -> int:
    print(f"slax from {pathlib.Path(slax.__file__).parent}, working directory {pathlib.Path.cwd()}")
    if "site-packages" not in pathlib.Path(slax.__file__).parts:
        print("FAILED: slax was not imported from an installed package")
        return 1
    results = {
        **user_module_checks(),
        **slangpy_style_checks(),
        **shipped_module_checks(),
        **mlp_checks(),
    }
    for name, ok in results.items():
        print(f"  {'ok' if ok else 'FAILED'}: {name}")
    failed = sum(not ok for ok in results.values())
    print(f"installed wheel: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
