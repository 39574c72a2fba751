"""A griffe extension for the API reference (mkdocs.yml): slax's docstrings write names as Sphinx
roles (``:func:`mlp_apply```), which Markdown would print as they are; this shows each as code."""

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
