"""What Slang's reflection does not say about a module-scope function, read from its source.

SlangPy's reflection gives a function one ``differentiable`` flag, set by any differentiability
attribute: it cannot tell a ``[ForwardDifferentiable]`` function (no ``bwd_diff``) from a
``[Differentiable]`` one, and it leaves the flag unset on a function that another declares a
derivative for (``[BackwardDerivativeOf(f)]``), which Slang differentiates. Nor does it give a
generic parameter's constraint (``T : IFoo``). Both are read here from the module's files as they
were loaded (:func:`slax._sources.texts`): the attributes on the function's declarations, and the
``[ForwardDerivativeOf(f)]``/``[BackwardDerivativeOf(f)]`` attributes naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable

_FORWARD = frozenset(
    {"Differentiable", "BackwardDifferentiable", "ForwardDifferentiable", "ForwardDerivative"}
)
"""Attributes under which Slang has ``fwd_diff(f)`` (Slang 2026.12)."""

_BACKWARD = frozenset({"Differentiable", "BackwardDifferentiable", "BackwardDerivative"})
"""Attributes under which Slang has ``bwd_diff(f)``; ``[ForwardDifferentiable]`` or a custom forward
derivative alone give none."""

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_INNERMOST_BODY = re.compile(r"\{[^{}]*\}")
_ATTRIBUTE_BLOCK = r"((?:\[[^\[\];]*\]\s*)*)"
_FORWARD_DERIVATIVE = re.compile(r"\bForwardDerivative\s*\(\s*(?:[\w.:]*[.:])?(\w+)")
_GENERICS = r"<(?:[^<>;()]|<[^<>;()]*>)*>"
"""A generic parameter list, ``<T : IFoo<float, 2>>``: no wider, so that in
``DifferentialPair<T> f<T>(...)`` the name is ``f``, not the return type's."""
_DECLARATION = re.compile(_ATTRIBUTE_BLOCK + rf"[^;\[\]]*?\b(\w+)\s*(?:{_GENERICS})?\s*\(", re.DOTALL)
"""A function declaration at module scope: its attribute blocks, its name."""
_DECLARATION_START = re.compile(r"\s*" + _DECLARATION.pattern, re.DOTALL)
"""The same, from the declaration's start (one try, where a search tries every position)."""
_DERIVATIVE_OF = re.compile(
    r"\b(Forward|Backward)DerivativeOf\s*\(\s*(?:[\w.:]*[.:])?(\w+)\s*(?:<[^()]*>)?\s*\)"
)


@dataclasses.dataclass(frozen=True)
class Modes:
    """The derivatives Slang has for a function: ``fwd_diff`` (forward) and ``bwd_diff`` (backward)."""

    forward: bool
    backward: bool
    custom_backward_only: bool = False
    """It declares a backward derivative of its own and no forward one: Slang's second derivatives
    run ``bwd_diff(fwd_diff(f))``, Slang's forward derivative of its body, not the declared one."""
    forward_derivative: str = ""
    """The forward derivative declared for it, if any: its second derivatives differentiate that."""
    forward_derivative_modes: Modes | None = None
    """The modes in which Slang differentiates :attr:`forward_derivative` in turn."""


def derivative_modes(texts: Iterable[str], name: str) -> Modes | None:
    """The modes in which Slang differentiates the module-scope function ``name``, from the
    attributes of its declarations and the derivatives declared for it in ``texts``; None where
    they declare none of Slang's differentiability attributes (reflection then decides)."""
    texts = tuple(texts)
    attributes, forward_derivatives = _declared(texts, name)
    if not attributes & (_FORWARD | _BACKWARD):
        return None
    forward_derivative = next((g for g in forward_derivatives if g != name), "")
    inner = _declared(texts, forward_derivative)[0] if forward_derivative else set()
    return Modes(
        forward=bool(attributes & _FORWARD),
        backward=bool(attributes & _BACKWARD),
        custom_backward_only="BackwardDerivative" in attributes and "ForwardDerivative" not in attributes,
        forward_derivative=forward_derivative,
        forward_derivative_modes=(
            Modes(forward=bool(inner & _FORWARD), backward=bool(inner & _BACKWARD)) if inner else None
        ),
    )


def _declared(texts: tuple[str, ...], name: str) -> tuple[set[str], list[str]]:
    """The differentiability attributes that apply to function ``name`` (``ForwardDerivative`` and
    ``BackwardDerivative`` for those declared elsewhere with ``...DerivativeOf(name)``), and the
    names of the forward derivatives declared for it."""
    attributes: set[str] = set()
    forward_derivatives: list[str] = []
    for text in texts:
        declarations = _declarations(text)
        for block in declarations.attributes.get(name, ()):
            attributes |= set(re.findall(r"\w+", re.sub(r"\([^()]*\)", "", block)))
            forward_derivatives += _FORWARD_DERIVATIVE.findall(block)
        attributes |= {f"{mode}Derivative" for mode, target in declarations.derivatives_of if target == name}
        forward_derivatives += declarations.forward_derivatives_of.get(name, ())
    return attributes, forward_derivatives


@dataclasses.dataclass(frozen=True)
class _Declarations:
    """A file's module-scope function declarations, read once (:func:`_declarations`)."""

    attributes: dict[str, list[str]]
    """Each declared function's attribute blocks (``[A][B(x)]``), one a declaration."""
    derivatives_of: frozenset[tuple[str, str]]
    """Every ``(Forward|Backward)DerivativeOf(f)`` attribute in the file, as ``(mode, f)``."""
    forward_derivatives_of: dict[str, list[str]]
    """``f`` -> the functions declared with ``[ForwardDerivativeOf(f)]``."""


@functools.lru_cache(maxsize=256)
def _declarations(text: str) -> _Declarations:
    """``text``'s declarations, cached: every function slax wraps from a module reads the same
    files (slax's own shaders among them), and a search for each name over a whole file costs the
    square of its declarations' lengths, a function at a time. Each declaration (what ends in ``;``
    once bodies are gone) is read from its start; one that does not begin with its attributes is
    searched."""
    attributes: dict[str, list[str]] = {}
    forward_derivatives_of: dict[str, list[str]] = {}
    scope = _module_scope(text)
    for declaration in scope.split(";"):
        found = _DECLARATION_START.match(declaration) or _DECLARATION.search(declaration)
        if found is None:
            continue
        block, declared = found.groups()
        attributes.setdefault(declared, []).append(block)
        for mode, target in _DERIVATIVE_OF.findall(block):
            if mode == "Forward":
                forward_derivatives_of.setdefault(target, []).append(declared)
    return _Declarations(attributes, frozenset(_DERIVATIVE_OF.findall(scope)), forward_derivatives_of)


def generic_constraints(texts: Iterable[str], name: str) -> dict[str, str]:
    """The interface each generic type parameter of function ``name`` is constrained to, as
    written in its declaration (``f<T : IFoo>`` -> ``{"T": "IFoo"}``)."""
    constraints: dict[str, str] = {}
    for text in texts:
        for params in re.findall(rf"\b{re.escape(name)}\s*<([^;()]*)>\s*\(", _module_scope(text)):
            for param in _split_top_level(params):
                found = re.fullmatch(r"\s*(?:typename\s+)?(\w+)\s*:\s*(.+?)\s*", param)
                if found:
                    constraints.setdefault(found.group(1), found.group(2))
    return constraints


def generic_values(texts: Iterable[str], name: str) -> list[str]:
    """The generic value parameters of function ``name`` (``f<T, let N : int>`` -> ``["N"]``),
    which no array's dtype can decide: a call binds them with ``specialize(N=4)``."""
    values: list[str] = []
    for text in texts:
        for params in re.findall(rf"\b{re.escape(name)}\s*<([^;()]*)>\s*\(", _module_scope(text)):
            for param in _split_top_level(params):
                found = re.fullmatch(r"\s*let\s+(\w+)\s*:.*", param, re.DOTALL)
                if found and found.group(1) not in values:
                    values.append(found.group(1))
    return values


@functools.lru_cache(maxsize=256)
def _module_scope(text: str) -> str:
    """``text`` without comments and with every ``{...}`` body replaced by ``;``: what is left
    are module-scope declarations, each ending in ``;``, with their attributes."""
    text = _COMMENTS.sub(" ", text)
    while True:
        stripped = _INNERMOST_BODY.sub(";", text)
        if stripped == text:
            return text
        text = stripped


def _split_top_level(params: str) -> list[str]:
    """``"T : IFoo<float, 2>, U"`` -> ``["T : IFoo<float, 2>", " U"]``."""
    parts, depth, start = [], 0, 0
    for k, char in enumerate(params):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(params[start:k])
            start = k + 1
    return [*parts, params[start:]]
