"""Slang function signatures, read from SlangPy reflection, as the array layouts JAX sees.

A Slang value becomes one or more arrays ("leaves"): a scalar, vector, matrix or fixed-size array is
one leaf whose trailing dims are the type's own (``float3`` -> ``(3,)``, ``float3x3`` -> ``(3, 3)``);
a struct becomes a dict of its fields' leaves. Leading dims of an argument are the call grid.

A parameter of one of SlangPy's tensor types (:class:`TensorType`) is one leaf holding the whole
tensor: its dims are the tensor's ``D`` dims and then its element's, known only from the argument
(:func:`with_tensor_shapes`).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from typing import TypeAlias

import numpy as np
import slangpy as spy

from slax._declarations import Modes

Kind = spy.TypeReflection.Kind
Scalar: TypeAlias = spy.TypeReflection.ScalarType

_SCALARS: dict[Scalar, tuple[str, str]] = {
    Scalar.float32: ("float32", "float"),
    Scalar.float16: ("float16", "half"),
    Scalar.int32: ("int32", "int"),
    Scalar.uint32: ("uint32", "uint"),
}
SLANG_SCALAR_FOR_DTYPE = {dtype: name for dtype, name in _SCALARS.values()}
FLOAT_DTYPES = ("float32", "float16")


class Direction(enum.Enum):
    IN = "in"
    OUT = "out"
    INOUT = "inout"


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One array of a Slang value: a field path inside structs, its dtype and element dims."""

    path: tuple[str, ...]
    dtype: str
    shape: tuple[int, ...]
    differentiable: bool
    slang_type: str
    """The leaf's own Slang type (a struct field's, not the struct's), for messages."""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def index_suffixes(self) -> list[str]:
        """Slang subscripts reaching each scalar in row-major order (``["[0][0]", "[0][1]", ...]``)."""
        return ["".join(f"[{i}]" for i in index) for index in np.ndindex(*self.shape)]

    def field_access(self) -> str:
        return "".join(f".{name}" for name in self.path)


@dataclasses.dataclass(frozen=True)
class TensorType:
    """A parameter of SlangPy's tensor types: a whole array the function reads (``ITensor``,
    ``IDiffTensor``) or writes (``IWTensor``, ``IWDiffTensor``) at indices of its choosing.

    ``kernel_type`` is the concrete type a generated kernel builds for it over its pointers
    (``shaders/slax/tensor.slang``): SlangPy's own concrete types hold ``StructuredBuffer``s,
    which no kernel can make from a pointer.
    """

    written: bool
    differentiable: bool
    rank: int
    kernel_type: str
    element: tuple[int, ...] = ()
    """The element type's own dims (``float3`` -> ``(3,)``)."""


_TENSOR_TYPES = {
    "ITensor": TensorType(False, False, 0, "SlaxTensor"),
    "SlaxTensor": TensorType(False, False, 0, "SlaxTensor"),
    "IWTensor": TensorType(True, False, 0, "SlaxTensor"),
    "IDiffTensor": TensorType(False, True, 0, "SlaxDiffTensor"),
    "SlaxDiffTensor": TensorType(False, True, 0, "SlaxDiffTensor"),
    "IWDiffTensor": TensorType(True, True, 0, "SlaxWDiffTensor"),
    "SlaxWDiffTensor": TensorType(True, True, 0, "SlaxWDiffTensor"),
}
_REFUSED_TENSOR_TYPES = {
    "IRWTensor": "a read-write tensor updated in place",
    "IRWDiffTensor": "a read-write tensor updated in place",
    "RWTensor": "a read-write tensor updated in place",
    "RWDiffTensor": "a read-write tensor updated in place",
    "AtomicTensor": "a read-write tensor updated in place",
}
_CONCRETE_TENSOR_TYPES = {
    "Tensor": "ITensor",
    "WTensor": "IWTensor",
    "DiffTensor": "SlaxDiffTensor",
    "WDiffTensor": "SlaxWDiffTensor",
    "PrimalTensor": "IDiffTensor",
}
"""SlangPy's concrete tensors, and what to declare instead. Compiled for SlangPy's CPU device or
Vulkan they hold ``StructuredBuffer``/``RWByteAddressBuffer`` resources (pointers only when compiled
for CUDA, ``StorageTraits`` in SlangPy's ``core.slang``), which a kernel handed XLA's buffers as
pointers cannot make; slax's types (``shaders/slax/tensor.slang``) have the same members over
pointers on every route."""
_TENSOR_ARGUMENTS = re.compile(r"^\w+<(.+),\s*(\d+)>$")


@dataclasses.dataclass(frozen=True)
class Value:
    """A parameter or the return value of a Slang function."""

    name: str
    slang_type: str
    direction: Direction
    leaves: tuple[Leaf, ...]
    is_struct: bool
    no_diff: bool
    unmapped_differential: str = ""
    """Where the struct's ``Differential`` holds members that no differentiable field maps to (JAX's
    tangent of a struct is a dict of its fields, so they would be lost): which, for the error that
    refuses its derivatives; else empty."""
    tensor: TensorType | None = None
    """For a parameter of SlangPy's tensor types: which (its one leaf is the whole tensor)."""

    @property
    def differentiable(self) -> bool:
        return any(leaf.differentiable for leaf in self.leaves)

    @property
    def is_input(self) -> bool:
        return self.direction is not Direction.OUT

    @property
    def is_output(self) -> bool:
        return self.direction is not Direction.IN


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a Slang function takes and gives, in array terms."""

    name: str
    params: tuple[Value, ...]
    result: Value | None
    forward: bool
    """Slang has ``fwd_diff`` of the function (``jax.jvp``)."""
    backward: bool
    """Slang has ``bwd_diff`` of the function (``jax.grad``, ``jax.vjp``)."""
    custom_backward_only: bool = False
    """It declares a backward derivative and no forward one (:class:`slax._declarations.Modes`)."""
    forward_derivative: str = ""
    """The forward derivative declared for it, if any."""
    nested_forward: bool = True
    """Slang has ``fwd_diff(fwd_diff(f))``, which its second derivatives run: false where
    :attr:`forward_derivative` is one Slang cannot differentiate in turn."""
    bounds_checked: bool = False
    """Its primal kernel checks every tensor index and reports the first outside its tensor in one
    more result (``slax.config.debug_bounds``): :data:`FAULT`."""

    @property
    def differentiable(self) -> bool:
        return self.forward or self.backward

    @property
    def inputs(self) -> tuple[Value, ...]:
        return tuple(p for p in self.params if p.is_input)

    @property
    def outputs(self) -> tuple[Value, ...]:
        """The values a call returns: the result, then ``out``/``inout`` parameters in order."""
        head = (self.result,) if self.result is not None else ()
        return head + tuple(p for p in self.params if p.is_output)


FAULT = Leaf((), "uint32", (3,), False, "uint")
"""The fault record of a bounds-checked kernel: (1 + the tensor parameter's position among the
tensor parameters, axis, index), zero where every index was inside."""


def read_signature(
    function: spy.FunctionReflection, layout: spy.ProgramLayout, modes: Modes | None = None
) -> Signature:
    """Builds a :class:`Signature` from (non-generic or specialized) function reflection.

    ``modes`` are the derivatives Slang has for it, as its source declares them
    (:func:`slax._declarations.derivative_modes`); without them, reflection's one
    ``differentiable`` flag stands for both. ``layout`` finds each struct's ``Differential``.
    """
    if modes is None:
        flag = function.has_modifier(spy.ModifierID.differentiable)
        modes = Modes(forward=flag, backward=flag)
    differentiable = modes.forward or modes.backward
    params = []
    for param in function.parameters:
        if param.has_modifier(spy.ModifierID.inout):
            direction = Direction.INOUT
        elif param.has_modifier(spy.ModifierID.out):
            direction = Direction.OUT
        else:
            direction = Direction.IN
        # Slang marks a parameter of a type that is not IDifferentiable (a tensor) no_diff itself.
        declared = param.has_modifier(spy.ModifierID.nodiff) and not _is_tensor(param.type)
        no_diff = declared or not differentiable
        params.append(_read_value(param.name, param.type, direction, no_diff, function.name, layout))
    result = None
    if function.return_type is not None and function.return_type.full_name != "void":
        result = _read_value(
            "result", function.return_type, Direction.OUT, not differentiable, function.name, layout
        )
    inner = modes.forward_derivative_modes
    return Signature(
        function.name,
        tuple(params),
        result,
        modes.forward,
        modes.backward,
        modes.custom_backward_only,
        modes.forward_derivative,
        nested_forward=not modes.forward_derivative or (inner is not None and inner.forward),
    )


_IDENTIFIER_NOT_GENERIC_HEAD = re.compile(r"\b[A-Za-z_]\w*\b(?!\s*<)")


def generic_names(type_name: str, layout: spy.ProgramLayout) -> list[str]:
    """Identifiers in a Slang type name that name no type: the generic parameters it uses.

    ``"Particle<T>"`` -> ``["T"]``; ``"vector<float,3>"`` -> ``[]``.
    """
    return [
        token
        for token in _IDENTIFIER_NOT_GENERIC_HEAD.findall(type_name)
        if token not in ("vector", "matrix") and layout.find_type_by_name(token) is None
    ]


def substitute_generics(type_name: str, chosen: dict[str, str]) -> str:
    """``"Particle<T>"`` with ``{"T": "half"}`` -> ``"Particle<half>"``."""
    return _IDENTIFIER_NOT_GENERIC_HEAD.sub(lambda m: chosen.get(m.group(0), m.group(0)), type_name)


_IMPLEMENTING_TENSORS = {
    "ITensor": "Tensor",
    "IWTensor": "WTensor",
    "IDiffTensor": "DiffTensor",
    "IWDiffTensor": "WDiffTensor",
}
"""SlangPy's struct implementing each tensor interface, for specialising a generic function."""


def argument_type(type_name: str) -> str:
    """The type of an argument Slang can specialise a parameter of ``type_name`` with: the name
    itself, but for a tensor interface SlangPy's struct implementing it (``"IDiffTensor<half, 2>"``
    -> ``"DiffTensor<half, 2>"``). Slang infers no generic argument from an interface-typed
    argument; the specialised parameter keeps its interface type."""
    head, _, rest = type_name.partition("<")
    return f"{_IMPLEMENTING_TENSORS[head]}<{rest}" if rest and head in _IMPLEMENTING_TENSORS else type_name


def _read_value(
    name: str,
    slang_type: spy.TypeReflection,
    direction: Direction,
    no_diff: bool,
    function: str,
    layout: spy.ProgramLayout,
) -> Value:
    if _is_tensor(slang_type):
        return _read_tensor(name, slang_type, no_diff, function, layout)
    if slang_type.kind != Kind.struct:
        leaf = _leaf(slang_type, (), no_diff, function, name)
        return Value(name, slang_type.full_name, direction, (leaf,), False, no_diff)
    # A struct that does not conform to IDifferentiable has no Differential: Slang holds it constant.
    differential = layout.find_type_by_name(f"{slang_type.full_name}.Differential")
    no_diff = no_diff or differential is None
    leaves = tuple(_struct_leaves(slang_type, (), no_diff, function, name))
    unmapped = "" if no_diff else _unmapped_differential(differential, leaves, function, name)
    return Value(name, slang_type.full_name, direction, leaves, True, no_diff, unmapped)


def _is_tensor(slang_type: spy.TypeReflection) -> bool:
    return slang_type.name in (*_TENSOR_TYPES, *_REFUSED_TENSOR_TYPES, *_CONCRETE_TENSOR_TYPES)


def _read_tensor(name, slang_type, no_diff, function, layout) -> Value:
    """A tensor parameter: one leaf of the element's type, whose shape :func:`with_tensor_shapes`
    completes with the tensor's dims. A written tensor is ``inout``: its operand is the zeroed
    array the kernel writes into, which the call returns."""
    base = slang_type.name
    found = _TENSOR_ARGUMENTS.match(slang_type.full_name)
    if base in _CONCRETE_TENSOR_TYPES:
        instead = _CONCRETE_TENSOR_TYPES[base]
        instead += f"<{found.group(1)}, {found.group(2)}>" if found else "<T, D>"
        raise TypeError(
            f"slax: parameter {name!r} of Slang function {function!r} has type "
            f"{slang_type.full_name!r}, SlangPy's concrete tensor, which holds StructuredBuffer "
            "resources on SlangPy's CPU device and Vulkan (pointers only on CUDA) that no slax kernel "
            "can make from XLA's buffers; slax refuses it on every route, so that a module runs the "
            f"same on each. Declare it {instead} instead"
            + (
                " (`import slax.tensor;`): SlangPy's members (`_primal`, `_grad_out`, `_grad_in`) over "
                "pointers, so a custom derivative writing `_grad_out.add(idx, g)` reads the same."
                if instead.startswith("Slax")
                else "."
            )
        )
    if base in _REFUSED_TENSOR_TYPES:
        raise TypeError(
            f"slax: parameter {name!r} of Slang function {function!r} has type "
            f"{slang_type.full_name!r}, {_REFUSED_TENSOR_TYPES[base]}, which slax does not pass. "
            "Declare inputs as ITensor<T, D> or IDiffTensor<T, D> and outputs as IWTensor<T, D> or "
            "IWDiffTensor<T, D> (a function that updates a tensor in place reads one and writes "
            "another); where a custom derivative needs the gradient buffers, declare "
            "SlaxDiffTensor<T, D> or SlaxWDiffTensor<T, D> (`import slax.tensor;`), whose `_primal`, "
            "`_grad_out` and `_grad_in` are SlangPy's DiffTensor's."
        )
    element = layout.find_type_by_name(found.group(1)) if found else None
    if found is None or element is None:
        raise TypeError(
            f"slax: cannot read the element type and rank of parameter {name!r} of Slang function "
            f"{function!r} (type {slang_type.full_name!r})."
        )
    leaf = _leaf(element, (), no_diff or not _TENSOR_TYPES[base].differentiable, function, name)
    kind = dataclasses.replace(_TENSOR_TYPES[base], rank=int(found.group(2)), element=leaf.shape)
    direction = Direction.INOUT if kind.written else Direction.IN
    return Value(name, slang_type.full_name, direction, (leaf,), False, no_diff, tensor=kind)


def with_tensor_shapes(signature: Signature, shapes: dict[str, tuple[int, ...]]) -> Signature:
    """``signature`` with each tensor parameter's leaf shaped as its argument: ``shapes[name]`` is
    the tensor's ``D`` dims, followed in the leaf by its element's."""
    params = []
    for value in signature.params:
        if value.tensor is not None:
            shape = tuple(shapes[value.name]) + value.tensor.element
            value = dataclasses.replace(value, leaves=(dataclasses.replace(value.leaves[0], shape=shape),))
        params.append(value)
    return dataclasses.replace(signature, params=tuple(params))


def _unmapped_differential(differential, leaves, function, name) -> str:
    """Empty where the struct's ``Differential`` holds no more numbers than its differentiable
    fields (Slang maps each field to its member, by name or ``[DerivativeMember(...)]``); else
    what it holds beside them."""
    members = [
        (".".join(leaf.path), leaf.size) for leaf in _struct_leaves(differential, (), False, function, name)
    ]
    held = sum(size for _, size in members)
    mapped = [leaf for leaf in leaves if leaf.differentiable]
    if held <= sum(leaf.size for leaf in mapped):
        return ""
    return (
        f"its Differential type {differential.full_name!r} holds {held} numbers "
        f"({', '.join(path for path, _ in members)}), more than its differentiable fields "
        f"({', '.join('.'.join(leaf.path) for leaf in mapped) or 'none'}) hold"
    )


def _struct_leaves(slang_type, path, no_diff, function, name):
    for field in slang_type.fields:
        field_no_diff = no_diff or field.has_modifier(spy.ModifierID.nodiff)
        if field.type.kind == Kind.struct:
            yield from _struct_leaves(field.type, path + (field.name,), field_no_diff, function, name)
        else:
            yield _leaf(field.type, path + (field.name,), field_no_diff, function, name)


def _leaf(slang_type, path, no_diff, function, name) -> Leaf:
    shape, scalar = _shape_and_scalar(slang_type, function, name)
    dtype = _SCALARS[scalar][0]
    differentiable = not no_diff and dtype in FLOAT_DTYPES
    return Leaf(path, dtype, shape, differentiable, slang_type.full_name)


def _shape_and_scalar(slang_type, function, name) -> tuple[tuple[int, ...], Scalar]:
    kind = slang_type.kind
    if kind in (Kind.scalar, Kind.vector, Kind.matrix) and slang_type.scalar_type in _SCALARS:
        if kind == Kind.scalar:
            return (), slang_type.scalar_type
        if kind == Kind.vector:
            return (slang_type.col_count,), slang_type.scalar_type
        return (slang_type.row_count, slang_type.col_count), slang_type.scalar_type
    if kind == Kind.array and slang_type.element_count > 0:
        inner, scalar = _shape_and_scalar(slang_type.element_type, function, name)
        return (slang_type.element_count,) + inner, scalar
    supported = ", ".join(s for _, s in _SCALARS.values())
    raise TypeError(
        f"slax: parameter {name!r} of Slang function {function!r} has type "
        f"{slang_type.full_name!r}, which slax cannot map to arrays; use scalars ({supported}), "
        "vectors, matrices, fixed-size arrays of those, or structs of them."
    )


def exact_number(value: object, dtype: str, what: str) -> np.ndarray:
    """``value`` (a Python or NumPy number, or a NumPy array of them) converted to ``dtype``, or an
    error naming ``what``, where the conversion would change it silently: a non-integral or
    out-of-range value for an integer type (3.9 would run as 3, -1 as 4294967295), a complex value,
    or a finite value that overflows a floating type.
    """
    if value is None:
        raise TypeError(f"slax: {what} is None; pass a number or an array.")
    if isinstance(value, int) and not isinstance(value, bool):
        given = np.asarray(value if -(2**63) <= value < 2**64 else float(value))
    else:
        given = np.asarray(value)
    if given.dtype == object or not (np.issubdtype(given.dtype, np.number) or given.dtype == bool):
        raise TypeError(f"slax: {what} must be a number or an array of numbers; got {value!r}.")
    if np.issubdtype(given.dtype, np.complexfloating):
        raise TypeError(f"slax: {what} takes real numbers; got the complex value {value!r}.")
    target = np.dtype(dtype)
    if np.issubdtype(target, np.integer):
        if np.issubdtype(given.dtype, np.floating):
            whole = np.isfinite(given) & (given == np.floor(given))
            if not np.all(whole):
                raise TypeError(
                    f"slax: {what} is an integer ({dtype}); got the non-integral value "
                    f"{_first(value, given, ~whole)}. Pass an int, rounded as you mean it."
                )
        info = np.iinfo(target)
        outside = (given < info.min) | (given > info.max)
        if np.any(outside):
            raise ValueError(
                f"slax: {what} takes {dtype} values from {info.min} to {info.max}; got "
                f"{_first(value, given, outside)}."
            )
        return given.astype(target)
    with np.errstate(over="ignore"):
        converted = given.astype(target)
    overflowed = np.isinf(converted) & np.isfinite(given)
    if np.any(overflowed):
        raise ValueError(
            f"slax: {what} is {dtype}, whose largest value is {np.finfo(target).max}; got "
            f"{_first(value, given, overflowed)}, which would become infinite."
        )
    return converted


def _first(value: object, given: np.ndarray, mask: np.ndarray) -> str:
    """The (first) offending value, as the user wrote it where it was one number."""
    return str(value) if given.ndim == 0 else str(given[mask].flat[0])
