"""Checking Slang derivatives against JAX's derivatives of a pure-JAX twin.

``check_grads(slang_fn, jax_fn, *args)`` runs both functions on the same inputs and compares
values, reverse-mode cotangents (``jax.vjp``) for every floating argument, forward-mode tangents
(``jax.jvp``) for every output and, with ``order=2``, Hessian-vector products. Random cotangents and
tangents come from a fixed seed. Float16 inputs are compared against the twin evaluated in float32 on
the same (rounded) inputs, so the error measured is slax's own. Both functions run at full float32
precision (``jax.default_matmul_precision("highest")``): on GPUs with tensor cores JAX's default lets
XLA multiply float32 matrices in TF32, and slax's MLP with it (slax.nn follows JAX's precision
rule), whose ~5e-4 relative error would be the precision's, not the derivatives'.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from slax._function import SlangFunction
from slax.nn._activations import ACTIVATIONS
from slax.nn._params import split_params

RELATIVE_TOLERANCE = {"float32": 2e-5, "float16": 1e-2}
"""Normwise relative tolerance per dtype: a few float32 ulps, about ten float16 ulps."""


@dataclasses.dataclass(frozen=True)
class GradCheckRow:
    """One comparison of a :func:`check_grads` run.

    Attributes:
      check: ``"value"``, ``"rev"`` (cotangents, ``jax.vjp``), ``"fwd"`` (tangents, ``jax.jvp``),
        ``"hvp rev"`` or ``"hvp fwd"`` (Hessian-vector products).
      argument: the argument or output compared (``x``, ``particle['mass']``, ``out[0]``).
      max_abs_error: the largest absolute difference.
      max_rel_error: ``max_abs_error`` over the reference's largest magnitude (normwise).
      tolerance: the largest ``max_rel_error`` that passes.
    """

    check: str
    argument: str
    max_abs_error: float
    max_rel_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        """Whether ``max_rel_error`` is within ``tolerance``."""
        return bool(self.max_rel_error <= self.tolerance)


@dataclasses.dataclass(frozen=True)
class GradCheckReport:
    """Per-argument errors of a :func:`check_grads` run; ``str(report)`` is a table."""

    rows: tuple[GradCheckRow, ...]

    @property
    def passed(self) -> bool:
        """Whether every row passed."""
        return all(row.passed for row in self.rows)

    def __str__(self) -> str:
        header = ("check", "argument", "max abs err", "max rel err", "tolerance", "pass")
        body = [
            (
                r.check,
                r.argument,
                f"{r.max_abs_error:.3g}",
                f"{r.max_rel_error:.3g}",
                f"{r.tolerance:.3g}",
                "yes" if r.passed else "NO",
            )
            for r in self.rows
        ]
        widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in [header, *body]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def assert_passed(self) -> None:
        """Passes where every row passed.

        Raises:
          AssertionError: a row failed; the message carries the table.
        """
        if not self.passed:
            raise AssertionError("slax.testing.check_grads: derivatives disagree\n" + str(self))


def check_grads(
    slang_fn: Callable[..., Any],
    jax_fn: Callable[..., Any],
    *args: Any,
    order: int = 1,
    modes: Sequence[str] = ("fwd", "rev"),
    seed: int = 0,
    rtol: float | None = None,
    raises: bool = False,
) -> GradCheckReport:
    """Compares ``slang_fn``'s values and derivatives with ``jax_fn``'s on ``args``.

    Args:
      slang_fn: the function under test (typically calling slax functions). Rows name arguments
        by Slang parameter name when it is a slax Slang function (``mod.polynomial``), else
        ``arg[0]``, ``arg[1]``...
      jax_fn: a pure-JAX twin computing the same mathematical function.
      *args: pytrees of arrays; floating leaves are differentiated, others held fixed.
      order: 1 for first derivatives; 2 adds Hessian-vector products in the chosen modes.
      modes: any of ``"fwd"`` (``jax.jvp``) and ``"rev"`` (``jax.vjp``).
      seed: seeds the random tangents and cotangents.
      rtol: normwise relative tolerance; default from the lowest-precision floating input.
      raises: raise ``AssertionError`` carrying the table when a check fails.

    Returns:
      The report, a :class:`GradCheckReport`; print it for the table.

    Raises:
      ValueError: ``order`` other than 1 or 2, or an unknown mode.
      AssertionError: with ``raises``, a check failed; the message carries the table.

    Example:
      >>> report = check_grads(mod.polynomial, lambda a, b, c, x: a*x*x + b*x + c, 2., 8., -1., x)
      >>> print(report)
    """
    if order not in (1, 2):
        raise ValueError(f"slax.testing.check_grads: order must be 1 or 2, got {order}.")
    unknown = set(modes) - {"fwd", "rev"}
    if unknown:
        raise ValueError(f"slax.testing.check_grads: unknown modes {sorted(unknown)}; use fwd, rev.")
    args = jax.tree.map(jnp.asarray, args)
    names = _leaf_names(slang_fn, args)
    slang_fn, jax_fn = _at_full_precision(slang_fn), _at_full_precision(jax_fn)
    tolerance = rtol if rtol is not None else _tolerance(args)
    reference_args = jax.tree.map(_upcast, args)
    key = jax.random.key(seed)
    rows: list[GradCheckRow] = []

    out_slang = slang_fn(*args)
    out_ref = jax_fn(*reference_args)
    rows += _compare("value", out_slang, out_ref, _leaf_names_of(out_ref, "out"), tolerance)

    key, tangent_key, cotangent_key = jax.random.split(key, 3)
    tangents = _random_like(tangent_key, args)
    cotangents = _random_like(cotangent_key, out_slang)
    if "rev" in modes:
        _, vjp_slang = jax.vjp(slang_fn, *args)
        _, vjp_ref = jax.vjp(jax_fn, *reference_args)
        grads = vjp_slang(cotangents)
        grads_ref = vjp_ref(jax.tree.map(_cotangent_for, cotangents, out_ref))
        rows += _compare("rev", grads, grads_ref, names, tolerance, only_float=args)
    if "fwd" in modes:
        _, tan_slang = jax.jvp(slang_fn, args, tangents)
        _, tan_ref = jax.jvp(jax_fn, reference_args, jax.tree.map(_upcast, tangents))
        rows += _compare("fwd", tan_slang, tan_ref, _leaf_names_of(out_ref, "d out"), tolerance)
    if order == 2:
        for mode in modes:
            hvp = _hvp(slang_fn, args, tangents, cotangents, mode)
            hvp_ref = _hvp(
                jax_fn,
                reference_args,
                jax.tree.map(_upcast, tangents),
                jax.tree.map(_cotangent_for, cotangents, out_ref),
                mode,
            )
            rows += _compare(f"hvp {mode}", hvp, hvp_ref, names, tolerance, only_float=args)
    report = GradCheckReport(tuple(rows))
    if raises:
        report.assert_passed()
    return report


def _at_full_precision(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` traced with float32 matrix products in full float32, not TF32 (see the module doc);
    the precision is recorded in the traced products (and in slax.nn's primitives), so their
    derivatives keep it."""

    @functools.wraps(fn)
    def full_precision(*args):
        with jax.default_matmul_precision("highest"):
            return fn(*args)

    return full_precision


def away_from_kinks(params: Any, x: jax.Array, margin: float = 3e-3) -> jax.Array:
    """The rows of ``x`` whose pre-activations in the MLP ``params`` exceed ``margin`` in every layer
    whose activation has a kink (LeakyReLU's and ReLU's at 0).

    Such an activation has no derivative at 0, and a pre-activation within rounding error of 0 may
    fall on either side in two correct implementations (in float16 that error is ~1e-3): the
    gradients of that sample then differ by the slopes' ratio, not by rounding. Gradient checks of
    networks compare on samples away from the kinks, as finite-difference checks of ReLU networks
    do.

    Args:
      params: an MLP's parameters (:data:`slax.nn.Params`), whose activations it follows.
      x: inputs ``(batch, in)``.
      margin: the smallest magnitude a pre-activation at a kink may have.

    Returns:
      The rows of ``x`` that are kept, ``(kept, in)``.
    """
    layers, activations = split_params(params)
    h = np.asarray(x, np.float32)
    keep = np.ones(h.shape[0], bool)
    for layer, name in zip(layers, activations):
        z = h @ np.asarray(layer["weight"], np.float32).T + np.asarray(layer["bias"], np.float32)
        if ACTIVATIONS[name].kink:
            keep &= np.all(np.abs(z) > margin, axis=-1)
        h = np.asarray(ACTIVATIONS[name].function(jnp.asarray(z)))
    return x[np.flatnonzero(keep)]


def _hvp(fn, args, tangents, cotangents, mode):
    """Derivative of the cotangent-weighted gradient along ``tangents``."""

    def weighted_grad(*primals):
        _, vjp = jax.vjp(fn, *primals)
        return vjp(cotangents)

    if mode == "fwd":
        return jax.jvp(weighted_grad, args, tangents)[1]
    _, vjp = jax.vjp(weighted_grad, *args)
    return vjp(jax.tree.map(_zero_cotangent_like, weighted_grad(*args), tangents))


def _cotangent_for(cotangent, output):
    """A cotangent in the twin's output dtype (float32 for float16 results); integer outputs keep
    their float0 (no) cotangent."""
    return cotangent if cotangent.dtype == jax.dtypes.float0 else cotangent.astype(output.dtype)


def _zero_cotangent_like(grad, tangent):
    return jnp.asarray(tangent, grad.dtype) if jnp.issubdtype(grad.dtype, jnp.floating) else grad


def _compare(check, got, want, names, tolerance, only_float=None):
    got_leaves = jax.tree.leaves(got)
    want_leaves = jax.tree.leaves(want)
    floats = (
        [jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) for a in jax.tree.leaves(only_float)]
        if only_float is not None
        else [True] * len(got_leaves)
    )
    rows = []
    for name, a, b, is_float in zip(names, got_leaves, want_leaves, floats):
        if not is_float or getattr(a, "dtype", None) == jax.dtypes.float0:
            continue
        rows.append(compare(check, name, a, b, tolerance))
    return rows


def compare(check: str, argument: str, got: Any, want: Any, tolerance: float) -> GradCheckRow:
    """One report row: the max abs error of ``got`` against ``want`` and that error relative to
    ``want``'s largest magnitude (a normwise error, meaningful where elements pass through zero).

    Args:
      check: the row's check, as :class:`GradCheckRow` names it.
      argument: the row's argument.
      got: the values under test (any array-like).
      want: the reference values, of ``got``'s shape.
      tolerance: the largest relative error that passes.

    Returns:
      The row, a :class:`GradCheckRow`.
    """
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    abs_error = float(np.max(np.abs(got64 - want64), initial=0.0))
    scale = max(float(np.max(np.abs(want64), initial=0.0)), 1e-30)
    return GradCheckRow(check, argument, abs_error, abs_error / scale, tolerance)


def multiply_add_results(a: float | int, x: np.ndarray, b: float | int) -> tuple[np.ndarray, ...]:
    """Every value ``a * x + b`` may correctly take in ``x``'s dtype, elementwise, with the scalars
    ``a`` and ``b`` first rounded to that dtype (as a kernel taking them as ``T`` does): rounded after
    the product and after the sum (as NumPy computes it), or rounded once (a fused multiply-add, which
    CUDA compilers and XLA contract it to), or for half, computed in float32 and rounded on store.

    A kernel's result matches NumPy exactly on Vulkan/lavapipe but not on a CUDA GPU, where ~5% of
    elements differ by one ulp; a result is right where it equals any of these.
    float64 holds the product of two float32s exactly, so the fused value is float64's sum rounded
    once more (for float32, off only where that sum lands on a float32 tie, with odds ~2^-29).

    Args:
      a: the scale.
      x: the array scaled (a NumPy array of any dtype).
      b: the shift.

    Returns:
      The values ``a * x + b`` may take, each of ``x``'s shape and dtype: for an integer ``x`` the
      one exact result.
    """
    x = np.asarray(x)
    scale, shift = np.asarray(a, x.dtype), np.asarray(b, x.dtype)
    rounded_twice = (scale * x + shift).astype(x.dtype)
    if not np.issubdtype(x.dtype, np.floating):
        return (rounded_twice,)

    def computed_in(dtype) -> np.ndarray:
        return (scale.astype(dtype) * x.astype(dtype) + shift.astype(dtype)).astype(x.dtype)

    return rounded_twice, computed_in(np.float64), computed_in(np.float32)


def _tolerance(args) -> float:
    dtypes = {str(leaf.dtype) for leaf in jax.tree.leaves(args)}
    return max((RELATIVE_TOLERANCE.get(d, 0.0) for d in dtypes), default=0.0) or RELATIVE_TOLERANCE["float32"]


def _upcast(leaf):
    return leaf.astype(jnp.float32) if leaf.dtype == jnp.float16 else leaf


def _random_like(key, tree):
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, max(len(leaves), 1))
    out = []
    for k, leaf in zip(keys, leaves):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            out.append(jax.random.normal(k, leaf.shape, leaf.dtype))
        else:
            out.append(np.zeros(leaf.shape, jax.dtypes.float0))
    return jax.tree.unflatten(treedef, out)


def _leaf_names(fn, args) -> list[str]:
    """A label per leaf of ``args`` for the report: a slax Slang function's parameter names (``x``,
    ``particle['mass']``), ``arg[0]``, ``arg[1]['w']``... for any other function."""
    roots = fn.arguments if isinstance(fn, SlangFunction) else ()
    names = []
    for index, arg in enumerate(args):
        root = roots[index] if index < len(roots) else f"arg[{index}]"
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        names += [root + jax.tree_util.keystr(path) for path, _ in leaves]
    return names


def _leaf_names_of(tree, prefix) -> list[str]:
    return [prefix + jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


__all__ = [
    "GradCheckReport",
    "GradCheckRow",
    "RELATIVE_TOLERANCE",
    "away_from_kinks",
    "check_grads",
    "compare",
    "multiply_add_results",
]
