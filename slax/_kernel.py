"""Hand-written Slang compute kernels called on JAX arrays (``SlangModule.kernel``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from slax._compile import KernelSpec, entry_point_parameters
from slax._config import current_routes
from slax._kernel_primitive import UINT_MAX, run_kernel
from slax._primitive import check_finite, vary_alike
from slax._sharding import across_devices
from slax._signature import SLANG_SCALAR_FOR_DTYPE, exact_number

_DTYPE_FOR_SLANG_SCALAR = {name: dtype for dtype, name in SLANG_SCALAR_FOR_DTYPE.items()}
_DTYPE_FOR_KERNEL_SCALAR = {
    **_DTYPE_FOR_SLANG_SCALAR,
    "double": "float64",
    "int64_t": "int64",
    "uint64_t": "uint64",
}

COUNT_SUFFIX = "_count"
"""``uniform uint <pointer>_count``: a scalar slax fills with that pointer's element count."""


class SlangKernel:
    """A hand-written compute entry point run on JAX arrays through the slax bridge.

    Its parameters are ``uniform``: one pointer per operand, one per result, then scalars. Calls
    check operand and result dtypes against the pointer types and scalar names against the rest.
    A ``uint`` scalar named ``<pointer>_count`` is that buffer's element count, passed by slax so
    that the kernel can keep its indices in bounds (``shaders/slax/kernel.slang``).

    Its threads and scalars are Python or NumPy numbers, fixed when a call is traced: a traced
    value (an argument under ``jax.jit``) is refused, naming it. Under ``jax.vmap`` a call runs
    one launch per example (a ``lax.map``). A kernel has no derivative of its own:
    ``jax.grad``/``jax.jvp`` through a call raise, saying how to attach one with
    ``jax.custom_vjp``.
    """

    def __init__(self, module: Any, entry: str):
        parameters = entry_point_parameters(module._reflection, entry)
        self.module = module
        self.entry = entry
        self._pointers = list(parameters.pointers)
        scalars = dict(parameters.scalars)
        self._counts = {
            name + COUNT_SUFFIX: k
            for k, (name, _) in enumerate(self._pointers)
            if scalars.get(name + COUNT_SUFFIX) == "uint"
        }
        self._scalars = {name: kind for name, kind in scalars.items() if name not in self._counts}
        self._spec = KernelSpec(entry, path=module.path, content=module.content)

    def __repr__(self) -> str:
        return f"<slax kernel {self.entry} from {self.module.path}>"

    def __call__(
        self,
        *operands: jax.Array,
        results: Sequence[jax.ShapeDtypeStruct],
        threads: int,
        in_place: Mapping[int, int] | None = None,
        **scalars: int | float,
    ) -> list[jax.Array]:
        """Runs the kernel with ``threads`` threads; returns new arrays shaped like ``results``.

        Args:
          *operands: arrays read through the kernel's first pointer parameters, in order.
          results: shapes and dtypes of the arrays the kernel writes.
          threads: how many threads to launch (the kernel checks its index against a count:
            its own scalar, or a ``<pointer>_count`` that slax passes).
          in_place: ``{operand index: result index}``; that result is the operand updated in
            place through the operand's pointer, e.g. gradient buffers that start at zero.
          **scalars: the kernel's scalar parameters by name, but for ``<pointer>_count`` ones.

        Returns:
          The results, a list of arrays shaped as ``results`` says, in its order.

        Raises:
          TypeError: operands and results that do not match the pointer parameters in number or
            dtype, an in-place result unlike its operand, unknown, missing or ``_count`` scalars,
            or a traced ``threads`` or scalar.
          ValueError: negative ``threads``, a scalar out of its Slang type's range, or a buffer of
            more elements than a ``uint`` count holds.
        """
        arrays = [jnp.asarray(o) for o in operands]
        aliases = tuple(sorted((in_place or {}).items()))
        fresh = [r for k, r in enumerate(results) if k not in {j for _, j in aliases}]
        if len(arrays) + len(fresh) != len(self._pointers):
            raise TypeError(
                f"slax: kernel {self.entry!r} has {len(self._pointers)} pointer parameters "
                f"({', '.join(n for n, _ in self._pointers)}) but got {len(arrays)} operand(s) and "
                f"{len(fresh)} result(s) not updated in place."
            )
        for operand, result in aliases:
            if (arrays[operand].shape, arrays[operand].dtype) != (
                tuple(results[result].shape),
                np.dtype(results[result].dtype),
            ):
                raise TypeError(
                    f"slax: kernel {self.entry!r}: result {result} is operand {operand} updated in "
                    f"place, so it needs its shape and dtype {arrays[operand].shape} "
                    f"{arrays[operand].dtype}; got {results[result].shape} {results[result].dtype}."
                )
        shapes = [(a.shape, a.dtype) for a in arrays] + [(r.shape, np.dtype(r.dtype)) for r in fresh]
        for (name, element), (shape, dtype) in zip(self._pointers, shapes):
            expected = _DTYPE_FOR_SLANG_SCALAR.get(element)
            if expected != str(dtype):
                raise TypeError(
                    f"slax: kernel {self.entry!r} parameter {name!r} points to {element!r} "
                    f"(dtype {expected}); got an array of dtype {dtype} and shape {shape}."
                )
        given_counts = sorted(set(scalars) & set(self._counts))
        if given_counts:
            raise TypeError(
                f"slax: kernel {self.entry!r}: {given_counts} are the element counts of its buffers, "
                "which slax passes itself; do not give them."
            )
        unknown = sorted(set(scalars) - set(self._scalars))
        missing = sorted(set(self._scalars) - set(scalars))
        if unknown or missing:
            raise TypeError(
                f"slax: kernel {self.entry!r} takes scalars {sorted(self._scalars)}; unknown: "
                f"{unknown}, missing: {missing}."
            )
        counts = {name: math.prod(shapes[k][0]) for name, k in self._counts.items()}
        too_large = {name: n for name, n in counts.items() if n > UINT_MAX}
        if too_large:
            raise ValueError(
                f"slax: kernel {self.entry!r}: buffers of {too_large} elements do not fit the uint "
                f"counts it declares (at most {UINT_MAX})."
            )
        traced = [
            name
            for name, value in [("threads", threads), *scalars.items()]
            if isinstance(value, jax.core.Tracer)
        ]
        if traced:
            raise TypeError(
                f"slax: kernel {self.entry!r}: {', '.join(traced)} got a traced value (an argument of "
                "a function under jax.jit, or a loop variable of lax.scan/fori_loop); a kernel's "
                "threads and scalars are fixed when the call is traced, as Python numbers or NumPy "
                "scalars. Make them static (jax.jit(f, static_argnames=...)), or pass a value that "
                "varies at run time as an operand array, read through a pointer parameter."
            )
        threads = int(exact_number(threads, "int64", f"threads of kernel {self.entry!r}"))
        if threads < 0:
            raise ValueError(f"slax: kernel {self.entry!r} needs threads >= 0, got {threads}.")
        scalar_args = tuple(
            sorted(
                [
                    *((name, self._scalar(name, value).item()) for name, value in scalars.items()),
                    *counts.items(),
                ]
            )
        )
        result_specs = tuple((tuple(r.shape), str(np.dtype(r.dtype))) for r in results)
        routes = current_routes()

        def call(axes, *arrays):
            del axes
            arrays = vary_alike(list(arrays))
            outputs = run_kernel(
                self._spec, arrays, result_specs, threads, scalar_args, aliases, routes=routes
            )
            check_finite(f"Slang kernel {self.entry!r} ({self.module.path})", arrays, outputs)
            return outputs

        # slax cannot know how a hand-written kernel's threads map to its buffers: on sharded
        # arrays it runs whole, on every device, on gathered operands (correct, not partitioned).
        return across_devices(call, arrays, [False] * len(arrays), [False] * len(results))

    def _scalar(self, name: str, value: Any) -> np.ndarray:
        """``value`` for the scalar parameter ``name``, refused where its Slang type would change it."""
        slang_type = self._scalars[name]
        dtype = _DTYPE_FOR_KERNEL_SCALAR.get(slang_type, "float64" if "float" in slang_type else "int64")
        return exact_number(value, dtype, f"scalar {name!r} of kernel {self.entry!r} (Slang {slang_type!r})")
