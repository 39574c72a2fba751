"""Calling a Slang function with JAX arrays (:class:`SlangFunction`).

``load_module("poly").polynomial`` is a :class:`SlangFunction`: it binds arguments to the Slang
signature, checks dtypes and shapes at trace time, and binds ``slang_call_p``
(``slax/_function_primitives.py``) over the broadcast grid of its arguments. Tensor parameters take
whole arrays and ``slax.grid`` sets the grid (``slax/_tensors.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import slangpy as spy

from slax._codegen import Mode, result_leaves
from slax._config import config, current_routes
from slax._declarations import derivative_modes, generic_constraints, generic_values
from slax._function_primitives import FunctionSpec, check_bounds, slang_call_p
from slax._primitive import check_finite, vary_alike
from slax._sharding import across_devices
from slax._signature import (
    SLANG_SCALAR_FOR_DTYPE,
    Leaf,
    Signature,
    Value,
    argument_type,
    exact_number,
    generic_names,
    read_signature,
    substitute_generics,
    with_tensor_shapes,
)
from slax._sources import texts
from slax._tensors import Grid, grid_coordinates, tensor_operand

if TYPE_CHECKING:
    from slax._module import SlangModule


class SlangFunction:
    """A Slang function called like a jax.numpy function, over a broadcast grid of arguments.

    Arguments broadcast NumPy-style over their leading (grid) dims; their trailing dims must be the
    Slang type's own (``float3`` -> ``(..., 3)``). Structs take dicts of arrays. The call returns
    the result with shape ``grid + result dims``; with ``out``/``inout`` parameters it returns a
    tuple ``(result, *outs)`` (without the result for ``void`` functions).
    """

    def __init__(self, module: SlangModule, name: str, reflection: spy.FunctionReflection):
        if reflection.is_overloaded:
            overloads = "; ".join(sorted(_declaration(overload) for overload in reflection.overloads))
            raise TypeError(
                f"slax: Slang function {name!r} in {module.path!r} is overloaded ({overloads}), and "
                "slax does not choose between overloads: an array fits a Slang type by its trailing "
                "dims and broadcasts over the rest, so one array fits several (a float over a (n, 2) "
                "grid, a float2 over (n,)). Give the overload to call a name of its own, e.g. a "
                "[Differentiable] wrapper that calls it, and call that."
            )
        self.module = module
        self.name = name
        self._reflection = reflection
        self._generic_uses = [
            (generic_names(p.type.full_name, module._layout), p.name) for p in reflection.parameters
        ]
        self._generic = any(names for names, _ in self._generic_uses)
        self._param_names = [p.name for p in reflection.parameters]
        self._modes = derivative_modes(texts(module.content), name)
        self._values = generic_values(texts(module.content), name)
        self._chosen: dict[str, str] = {}
        self._signatures: dict[tuple[tuple[str, str], ...], Signature] = {}
        self.__doc__ = f"Slang function {name!r} from {module.path}."

    def specialize(self, **types: str | int) -> SlangFunction:
        """This function with its generic parameters bound: type parameters to the named Slang
        types, e.g. ``mod.f.specialize(T="Foo")`` for ``f<T : IFoo>(T t)``, whose argument ``t`` is
        then a dict of ``Foo``'s fields; value parameters to ints, e.g. ``specialize(N=4)`` for
        ``f<let N : int>(vector<float, N> v)``, which no dtype can decide. Type parameters left
        out specialise by dtype, as in a direct call.

        Args:
          **types: a Slang type's name for each generic type parameter bound, an int for each
            value parameter.

        Returns:
          The function with those parameters bound, a new :class:`SlangFunction`.

        Raises:
          TypeError: a name is not a generic parameter of the function, no such type exists, or a
            value parameter is given anything but an int (or a type parameter an int).
        """
        parameters = sorted({name for names, _ in self._generic_uses for name in names})
        layout = self.module._layout
        bound: dict[str, str] = {}
        for parameter, type_name in types.items():
            if parameter in self._values:
                if isinstance(type_name, bool) or not isinstance(type_name, (int, np.integer)):
                    raise TypeError(
                        f"slax: {self.name}.specialize({parameter}={type_name!r}): {parameter} is a "
                        f"generic value parameter (let {parameter}); pass an int."
                    )
                bound[parameter] = str(int(type_name))
                continue
            if parameter not in parameters:
                raise TypeError(
                    f"slax: {self.name}.specialize() got {parameter}={type_name!r}, but {self.name}'s "
                    f"generic type parameters are {parameters or 'none'}."
                )
            if not isinstance(type_name, str) or layout.find_type_by_name(type_name) is None:
                raise TypeError(
                    f"slax: {self.name}.specialize({parameter}={type_name!r}): module {self.module.path!r} "
                    "has no such type; pass a Slang type's name as a string, e.g. a struct it declares."
                )
            bound[parameter] = type_name
        specialized = SlangFunction(self.module, self.name, self._reflection)
        specialized._chosen = {**self._chosen, **bound}
        return specialized

    def __repr__(self) -> str:
        return f"<slax function {self.name} from {self.module.path}>"

    def signature(self, *args: Any, **kwargs: Any) -> Signature:
        """The array signature a call with these arguments resolves to (generic functions
        specialise by dtype): each Slang parameter's dtype and trailing shape, for inspection.

        Args:
          *args: a call's arguments, as :meth:`__call__` takes them.
          **kwargs: the same, by name.

        Returns:
          The signature: each parameter's and result's dtype and trailing shape.

        Raises:
          TypeError: as :meth:`__call__` raises it.
          ValueError: as :meth:`__call__` raises it.
        """
        return self._resolve(self._bind(args, kwargs))[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the Slang function at every point of its arguments' broadcast grid.

        Args:
          *args: the arguments that are not ``out`` (:attr:`arguments`), in order: arrays or
            Python numbers, dicts of them for structs.
          **kwargs: the same, by Slang parameter name.

        Returns:
          The result, shaped ``grid + result dims`` (a dict for a struct); with ``out``/``inout``
          parameters the tuple ``(result, *outs)``, without the result for a ``void`` function.

        Raises:
          TypeError: a missing, extra or repeated argument, a wrong dtype, a parameter type slax
            does not map, or a generic left unspecialised.
          ValueError: a shape that does not end in its Slang type's dims, grids that do not
            broadcast, or a number out of its Slang type's range.
          slax.SlangCompileError: Slang rejected the kernel slax generated for the call.
        """
        bound = self._bind(args, kwargs)
        signature, operands = self._resolve(bound)
        grids = self._require_one_grid(signature, operands)
        spec = FunctionSpec(self.module.path, signature, self.module.content, self.module._names)
        routes = current_routes()

        checked = config.debug_bounds and any(value.tensor for value in signature.params)

        def call(axes, *operands):
            del axes  # elementwise over the grid: nothing sums over the batch
            operands = vary_alike(list(operands))
            if checked:
                check_bounds(spec, operands, routes)
            flat = slang_call_p.bind(*operands, function=spec, routes=routes)
            check_finite(f"Slang function {self.name!r} ({self.module.path})", operands, flat)
            return flat

        grid = np.broadcast_shapes(*grids) if grids else ()
        # The grid's first axis is the batch; an argument broadcast along it is replicated. A call
        # that writes a tensor runs whole on every device: its grid points may write anywhere in it.
        writes = any(value.tensor is not None and value.tensor.written for value in signature.params)
        batched = [len(own) == len(grid) and own[0] == grid[0] != 1 for own in grids] if grid else []
        batched = [False] * len(batched) if writes else batched
        outputs = len(result_leaves(signature, Mode.PRIMAL))
        flat = across_devices(call, operands, batched or [False] * len(operands), [bool(grid)] * outputs)
        return self._unflatten(signature, flat)

    @property
    def arguments(self) -> tuple[str, ...]:
        """The names of the arguments a call takes, in order: the Slang parameters that are not
        ``out`` (``out`` parameters come back as results)."""
        return tuple(
            p.name
            for p in self._reflection.parameters
            if p.has_modifier(spy.ModifierID.inout) or not p.has_modifier(spy.ModifierID.out)
        )

    def _bind(self, args, kwargs) -> dict[str, Any]:
        inputs = self.arguments
        if len(args) > len(inputs):
            raise TypeError(
                f"slax: {self.name}() takes {len(inputs)} argument(s) ({', '.join(inputs)}) "
                f"but {len(args)} were given."
            )
        bound = dict(zip(inputs, args))
        for key, value in kwargs.items():
            if key not in inputs:
                hint = " (it is an `out` parameter, returned, not passed)" if key in self._param_names else ""
                raise TypeError(
                    f"slax: {self.name}() got an unexpected keyword argument {key!r}{hint}; its "
                    f"inputs are {', '.join(inputs)}."
                )
            if key in bound:
                raise TypeError(f"slax: {self.name}() got multiple values for argument {key!r}.")
            bound[key] = value
        missing = [name for name in inputs if name not in bound]
        if missing:
            raise TypeError(f"slax: {self.name}() missing argument(s): {', '.join(missing)}.")
        return bound

    def _resolve(self, bound: dict[str, Any]) -> tuple[Signature, list[jax.Array]]:
        key = self._generic_dtypes(bound) if self._generic else {}
        cache_key = tuple(sorted(key.items()))
        signature = self._signatures.get(cache_key)
        if signature is None:
            reflection = self._specialize(key) if self._generic else self._reflection
            signature = read_signature(reflection, self.module._layout, self._modes)
            self._signatures[cache_key] = signature
        operands: list[jax.Array] = []
        tensor_shapes = {}
        for value in signature.inputs:
            if value.tensor is None:
                operands += self._operands(value, bound[value.name])
                continue
            operands.append(tensor_operand(value, bound[value.name], self.name))
            tensor_shapes[value.name] = operands[-1].shape[: value.tensor.rank]
        return with_tensor_shapes(signature, tensor_shapes), operands

    def _generic_dtypes(self, bound: dict[str, Any]) -> dict[str, str]:
        """Each generic type parameter's Slang scalar, from the first array argument that uses it.

        Arguments given as Python numbers do not decide a type; undecided ones default to float.
        Those chosen by :meth:`specialize` stay as chosen.
        """
        chosen: dict[str, str] = dict(self._chosen)
        unbound = [name for name in self._values if name not in chosen]
        if unbound:
            example = ", ".join(f"{name}=4" for name in unbound)
            raise TypeError(
                f"slax: {self.name}() has generic value parameter(s) {', '.join(unbound)}, which no "
                f"array dtype decides; bind them first: mod.{self.name}.specialize({example})(...)."
            )
        for names, param in self._generic_uses:
            dtype = _array_dtype(bound.get(param))
            for name in names:
                if name not in chosen and dtype in SLANG_SCALAR_FOR_DTYPE:
                    chosen[name] = SLANG_SCALAR_FOR_DTYPE[dtype]
        for names, _ in self._generic_uses:
            for name in names:
                chosen.setdefault(name, "float")
        return chosen

    def _specialize(self, generic: dict[str, str]) -> spy.FunctionReflection:
        layout = self.module._layout
        names = [substitute_generics(p.type.full_name, generic) for p in self._reflection.parameters]
        types = [layout.find_type_by_name(argument_type(name)) for name in names]
        specialized = None
        if all(t is not None for t in types):
            specialized = self._reflection.specialize_with_arg_types(types)
        if specialized is None or not specialized.is_valid:
            raise TypeError(self._unspecialized_message(generic, names))
        return specialized

    def _unspecialized_message(self, generic: dict[str, str], names: list[str]) -> str:
        """Why the call could not be specialised: which type each parameter got and from where,
        and, for a parameter constrained to an interface, how to name the struct to use."""
        constraints = generic_constraints(texts(self.module.content), self.name)
        chosen = ", ".join(
            f"{p}={t} ({'as .specialize() named it' if p in self._chosen else 'by the argument dtypes'})"
            for p, t in generic.items()
        )
        message = (
            f"slax: cannot specialise generic Slang function {self.name!r} with {chosen}: Slang "
            f"rejects parameter types {names}."
        )
        interfaces = {p: c for p, c in constraints.items() if p in generic and p not in self._chosen}
        if interfaces:
            example = ", ".join(f'{p}="MyStruct"' for p in interfaces)
            message += (
                " slax picks a generic type from array dtypes only, and "
                + ", ".join(f"{p} is constrained to {c!r}" for p, c in interfaces.items())
                + f": name the struct that conforms and that the argument's dict holds the fields "
                f"of, mod.{self.name}.specialize({example})(...)."
            )
        return message

    def _operands(self, value: Value, argument: Any) -> list[jax.Array]:
        if not value.is_struct:
            return [self._operand(value.leaves[0], argument, value.name)]
        if not isinstance(argument, Mapping):
            raise TypeError(
                f"slax: argument {value.name!r} of {self.name}() is the Slang struct "
                f"{value.slang_type!r}; pass a dict with keys {_struct_keys(value)}, got "
                f"{type(argument).__name__}."
            )
        _check_keys(self.name, value, argument, ())
        operands = []
        for leaf in value.leaves:
            item = argument
            for field in leaf.path:
                item = item[field]
            label = f"{value.name}[{']['.join(repr(f) for f in leaf.path)}]"
            operands.append(self._operand(leaf, item, label))
        return operands

    def _operand(self, leaf: Leaf, argument: Any, label: str) -> jax.Array:
        slang_type = leaf.slang_type  # a struct field's own type, not the struct's
        what = f"argument {label!r} of {self.name}() (Slang {slang_type!r})"
        if isinstance(argument, Grid):
            return grid_coordinates(argument, leaf, what)
        if argument is None or isinstance(argument, (bool, int, float, complex, np.generic)):
            array = jnp.asarray(exact_number(argument, leaf.dtype, what))
        elif isinstance(argument, jax.Array) and _is_weakly_typed(argument):
            array = _weak_operand(argument, leaf.dtype, what)
        else:
            try:
                array = jnp.asarray(argument)
            except TypeError as error:
                raise TypeError(
                    f"slax: argument {label!r} of {self.name}() must be an array or a number, "
                    f"got {type(argument).__name__}."
                ) from error
            if array.dtype != np.dtype(leaf.dtype):
                raise TypeError(
                    f"slax: argument {label!r} of {self.name}() is Slang {slang_type!r}, "
                    f"which needs dtype {leaf.dtype}; got {array.dtype}. Cast it with "
                    f".astype(jnp.{leaf.dtype})."
                )
        if array.ndim < len(leaf.shape) or array.shape[array.ndim - len(leaf.shape) :] != leaf.shape:
            raise ValueError(
                f"slax: argument {label!r} of {self.name}() is Slang {slang_type!r}, so its "
                f"shape must end in {leaf.shape} (leading dims are the call grid); got shape "
                f"{array.shape}."
            )
        return array

    def _require_one_grid(self, signature: Signature, operands: list[jax.Array]) -> list[tuple[int, ...]]:
        """Each operand's grid (its shape but the Slang type's); raises ValueError, naming each
        argument's grid, if they do not broadcast."""
        labelled = []
        shapes = []
        leaves = [(v, leaf) for v in signature.inputs for leaf in v.leaves]
        for (value, leaf), operand in zip(leaves, operands):
            grid = operand.shape[: operand.ndim - len(leaf.shape)]
            shapes.append(grid)
            labelled.append(f"{value.name}{'.' + '.'.join(leaf.path) if leaf.path else ''}: {grid}")
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise ValueError(
                f"slax: the arguments of {self.name}() do not broadcast to one call grid; their "
                f"grid shapes (shape without the Slang type's own dims) are {'; '.join(labelled)}."
            ) from None
        return shapes

    def _unflatten(self, signature: Signature, flat: list[jax.Array]) -> Any:
        flat_iter = iter(flat)
        outputs: list[Any] = []
        for value in signature.outputs:
            if value.is_struct:
                tree: dict[str, Any] = {}
                for leaf in value.leaves:
                    node = tree
                    for field in leaf.path[:-1]:
                        node = node.setdefault(field, {})
                    node[leaf.path[-1]] = next(flat_iter)
                outputs.append(tree)
            else:
                outputs.append(next(flat_iter))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _declaration(function: spy.FunctionReflection) -> str:
    """``function``'s declaration as Slang writes it: ``float f(inout float3 x)``."""
    parameters = ", ".join(f"{_direction(p)}{p.type.full_name} {p.name}" for p in function.parameters)
    return f"{function.return_type.full_name} {function.name}({parameters})"


def _direction(parameter: spy.VariableReflection) -> str:
    for modifier in (spy.ModifierID.inout, spy.ModifierID.out):
        if parameter.has_modifier(modifier):
            return f"{modifier.name} "
    return ""


def _weak_operand(argument: jax.Array, dtype: str, what: str) -> jax.Array:
    """A Python number JAX holds (weakly typed) in the Slang parameter's dtype: checked like a
    number where its value is known; traced, a float for an integer parameter cannot be checked
    before it runs, so it is refused rather than truncated. A traced int converts as JAX's
    ``astype`` converts it (a loop index for a ``uint`` is the common case; a negative one wraps,
    as README says), since refusing every traced int for a ``uint`` would refuse those indices."""
    if not isinstance(argument, jax.core.Tracer):
        return jnp.asarray(exact_number(np.asarray(argument), dtype, what))
    if jnp.issubdtype(argument.dtype, jnp.floating) and jnp.issubdtype(np.dtype(dtype), jnp.integer):
        raise TypeError(
            f"slax: {what} is an integer ({dtype}); got a float traced by JAX, which would be "
            f"truncated. Pass an int, or round it yourself: jnp.round(x).astype(jnp.{dtype})."
        )
    return argument.astype(dtype)


def _is_weakly_typed(array: jax.Array) -> bool:
    """Python scalars traced by JAX are weakly typed: they take the Slang parameter's dtype."""
    aval = getattr(array, "aval", None)
    return bool(getattr(aval, "weak_type", getattr(array, "weak_type", False)))


def _array_dtype(argument: Any) -> str | None:
    """The dtype an argument brings to a generic call (the first leaf's, for dicts)."""
    if isinstance(argument, Mapping):
        for item in argument.values():
            found = _array_dtype(item)
            if found is not None:
                return found
        return None
    if hasattr(argument, "dtype") and not (isinstance(argument, jax.Array) and _is_weakly_typed(argument)):
        return str(argument.dtype)
    return None


def _struct_keys(value: Value) -> list[str]:
    return sorted({leaf.path[0] for leaf in value.leaves})


def _check_keys(function: str, value: Value, argument: Mapping, prefix: tuple[str, ...]) -> None:
    expected = sorted({leaf.path[len(prefix)] for leaf in value.leaves if leaf.path[: len(prefix)] == prefix})
    given = sorted(argument.keys())
    if expected != given:
        where = value.name + "".join(f"[{p!r}]" for p in prefix)
        raise TypeError(
            f"slax: argument {where!r} of {function}() is the Slang struct {value.slang_type!r}; "
            f"expected keys {expected}, got {given}."
        )
    for key in expected:
        nested = [leaf for leaf in value.leaves if leaf.path[: len(prefix) + 1] == prefix + (key,)]
        if len(nested[0].path) > len(prefix) + 1:
            if not isinstance(argument[key], Mapping):
                raise TypeError(
                    f"slax: field {key!r} of argument {value.name!r} of {function}() is a struct; "
                    f"pass a dict, got {type(argument[key]).__name__}."
                )
            _check_keys(function, value, argument[key], prefix + (key,))
