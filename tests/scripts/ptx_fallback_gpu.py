"""Runs Slang functions on a GPU with the PTX route's compile limit set below what any compile
takes (``SLAX_PTX_COMPILE_TIMEOUT``), so that every kernel falls back to the SlangPy route, and
reports as JSON what ran: each value and gradient against its JAX twin, and the warnings given.
Run by tests/test_ptx_launch.py in a subprocess with ``SLAX_CUDA_LAUNCH=ptx`` on a CUDA machine."""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import slax
from slax import examples

found: dict = {"errors": {}, "warnings": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = slax.load_module(examples.MODULE)
    for example in examples.EXAMPLES[:3]:  # scalars, vectors, a struct
        args = example.draw(np.random.default_rng(7), jnp.float32)
        fn = module[example.name]

        def loss(*a, f=fn):
            return jnp.sum(jnp.asarray(jax.tree.leaves(f(*a))[0]) ** 2)

        def twin_loss(*a, f=example.twin):
            return jnp.sum(jnp.asarray(jax.tree.leaves(f(*a))[0]) ** 2)

        got = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(*args)
        want = jax.value_and_grad(twin_loss, argnums=tuple(range(len(args))))(*args)
        errors = jax.tree.map(
            lambda g, w: float(jnp.max(jnp.abs(g - w)) / (jnp.max(jnp.abs(w)) + 1e-30)), got, want
        )
        found["errors"][example.name] = max(jax.tree.leaves(errors))
found["warnings"] = [str(w.message) for w in caught]
print(json.dumps(found))
