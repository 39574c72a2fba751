"""Griffe extensions for the API reference (mkdocs.yml): slax's docstrings write names as Sphinx
roles (``:func:`mlp_apply```), which Markdown would print as they are; and a parameter whose
default is a named constant (``activation=HIDDEN_DEFAULT``) would show the name, not the value."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrites ``:role:`name``` as ``name`` in code, and ````text```` (reST's inline literal) as
    ``text`` in code, in every docstring as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = text.replace("``", "`")


class ConstantDefaults(griffe.Extension):
    """Shows a parameter's default that names a module-level constant of the package as the
    constant's value: ``activation='leaky_relu'``, not ``activation=HIDDEN_DEFAULT``."""

    def on_function(self, *, func: griffe.Function, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for parameter in func.parameters:
            if not isinstance(parameter.default, griffe.ExprName):
                continue
            try:
                constant = loader.modules_collection[parameter.default.canonical_path]
            except KeyError:
                continue
            if constant.is_attribute and constant.parent.is_module and constant.value is not None:
                parameter.default = constant.value
