"""Run by tests/test_sharding.py in a process with several host CPU devices (XLA_FLAGS set there):
a batch-sharded array reaches a Slang function by every path JAX allows (an argument, a closure, a
value computed from a closure, inside vmap, inside scan, under grad and jvp, as a tensor argument),
under jax.jit, in both sharding modes. Each answer equals its pure-JAX twin's on one device, or the
call is refused: as plain JAX refuses it, or by slax naming what to change where it cannot split
the call (REFUSED). Prints one line per case; any other outcome raises."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import slax
from slax.examples import TENSOR_MODULE, bilinear_twin
from slax.testing import RELATIVE_TOLERANCE

DEVICES = len(jax.devices())
TOLERANCE = RELATIVE_TOLERANCE["float32"]
poly_slang = slax.load_module("poly").polynomial
bilinear_slang = slax.load_module(TENSOR_MODULE).bilinear
rng = np.random.default_rng(0)
x_host = rng.normal(size=(8 * DEVICES,)).astype(np.float32)
rows_host = rng.normal(size=(3, 8 * DEVICES)).astype(np.float32)
texture_host = rng.uniform(size=(6, 5, 3)).astype(np.float32)
uv_host = rng.uniform(size=(8 * DEVICES, 2)).astype(np.float32)
a = float(rng.normal())  # a Python number: plain JAX refuses more closures given a typed scalar


def poly_twin(a, b, c, x):
    return a * x * x + b * x + c


def cases(poly, bilinear, x, rows, texture, uv):
    """name -> (function, its arguments): the same program for the Slang functions and their twins.
    The sharded arrays are passed as arguments, or reach the function from its closure."""

    def loss(a, x):
        return jnp.sum(poly(a, 8.0, -1.0, x) ** 2)

    return {
        "argument grad": (jax.grad(loss, (0, 1)), (a, x)),
        "argument jvp": (lambda a, x: jax.jvp(loss, (a, x), (np.float32(0.5), x)), (a, x)),
        "closure": (lambda a: poly(a, 8.0, -1.0, x), (a,)),
        "closure grad": (jax.grad(lambda a: loss(a, x)), (a,)),
        "closure jvp": (lambda a: jax.jvp(lambda a: poly(a, 8.0, -1.0, x), (a,), (np.float32(0.5),)), (a,)),
        "computed from a closure": (jax.grad(lambda a: loss(a, 2 * x + 1)), (a,)),
        "closure in vmap": (lambda a: jax.vmap(lambda a: loss(a, x))(jnp.stack([a, 2 * a])), (a,)),
        "vmap over the sharded axis": (lambda a, x: jax.vmap(lambda x: poly(a, 8.0, -1.0, x))(x), (a, x)),
        "vmap over a closure": (lambda a: jax.vmap(lambda row: poly(a, 8.0, -1.0, row))(rows), (a,)),
        "scan over rows of a closure": (
            lambda a: jax.lax.scan(lambda carry, row: (carry + loss(a, row), None), a, rows)[0],
            (a,),
        ),
        "grad through scan": (
            jax.grad(lambda a: jax.lax.scan(lambda carry, row: (carry + loss(carry, row), None), a, rows)[0]),
            (a,),
        ),
        "tensor argument, closure": (jax.grad(lambda a: jnp.sum(bilinear(texture * a, uv) ** 2)), (a,)),
        "tensor argument, sharded coordinates": (
            jax.grad(lambda a, uv: jnp.sum(bilinear(texture * a, uv) ** 2), (0, 1)),
            (a, uv),
        ),
        "tensor argument, jvp": (
            lambda a: jax.jvp(lambda t: bilinear(t, uv), (texture * a,), (texture,)),
            (a,),
        ),
    }


CLOSED_OVER = "Pass that array to the jitted function as an argument"
REFUSED = {
    "computed from a closure": CLOSED_OVER,
    "vmap over a closure": CLOSED_OVER,
    "scan over rows of a closure": CLOSED_OVER,
    "grad through scan": CLOSED_OVER,
    "vmap over the sharded axis": "jax.vmap takes those axes away from jax.shard_map",
}
"""Cases slax may refuse where plain JAX computes, and what its error says: a value computed under
jit from a closed-over array carries a mesh whose devices the program does not name, and a vmap
over an explicitly sharded axis takes that axis from jax.shard_map."""


def run(function, arguments):
    """``jax.jit(function)(*arguments)``, or the exception it raises."""
    try:
        return jax.jit(function)(*arguments)
    except Exception as error:  # noqa: BLE001 (plain JAX's refusals are the reference)
        return error


reference = cases(poly_twin, bilinear_twin, x_host, rows_host, texture_host, uv_host)
for mode in (AxisType.Explicit, AxisType.Auto):
    mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(mode,))
    batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    x, uv = jax.device_put(x_host, batch), jax.device_put(uv_host, batch)
    rows = jax.device_put(rows_host, NamedSharding(mesh, P(None, "data")))
    texture = jax.device_put(texture_host, replicated)
    twins = cases(poly_twin, bilinear_twin, x, rows, texture, uv)
    for name, (function, arguments) in cases(poly_slang, bilinear_slang, x, rows, texture, uv).items():
        plain, got = run(twins[name][0], arguments), run(function, arguments)
        if isinstance(got, Exception):
            if type(got) is type(plain):
                print(f"{mode.name} {name}: refused as plain JAX refuses it")
                continue
            assert name in REFUSED and REFUSED[name] in str(got), (mode.name, name, got)
            print(f"{mode.name} {name}: refused by slax, saying what to change")
            continue
        want = run(*reference[name])
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{mode.name} {name}")
        print(f"{mode.name} {name}: ok")

print(f"sharded values by every path on {DEVICES} devices: ok", file=sys.stdout)
