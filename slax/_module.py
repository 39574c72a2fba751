"""Loading Slang modules (:func:`load_module`), whose functions become JAX-callable.

A :class:`SlangModule` hands out a :class:`slax._function.SlangFunction` per Slang function and a
:class:`slax._kernel.SlangKernel` per compute entry point.
"""

from __future__ import annotations

import os
import pathlib
import re

import slangpy as spy

from slax._codegen import KernelNames, name_prefix
from slax._compile import load_slang_module
from slax._config import REFLECTION_ENV_VAR
from slax._device import SHADER_DIR, reflection_device, reflection_override, writable_cache_dir
from slax._errors import SlangCompileError
from slax._function import SlangFunction
from slax._kernel import SlangKernel
from slax._sources import identifiers


def load_module(path_or_name: str | os.PathLike[str]) -> SlangModule:
    """Loads a Slang module whose functions become JAX-callable.

    Args:
      path_or_name: a ``.slang`` file path, or a module name found on the include path
        (slax's ``shaders/`` directory), e.g. ``"poly"`` or ``"poly.slang"``.

    Raises:
      FileNotFoundError: no such file on disk or on the include path.
      ValueError: the path holds a backslash (outside Windows), which Slang cannot open.
      slax.SlangCompileError: Slang rejected the module; carries its diagnostics with file:line.
    """
    path = _resolve(path_or_name)
    if os.sep != "\\" and "\\" in str(path):
        raise ValueError(
            f"slax.load_module: Slang reads '\\' in a path as a directory separator, so it cannot "
            f"open {str(path)!r}; move or link the file to a path without backslashes."
        )
    try:
        reflection, content = load_slang_module(reflection_device(), str(path))
    except SlangCompileError as error:
        chosen = reflection_override()
        if chosen is None:
            raise
        raise SlangCompileError(
            f"{error}\n(slax reflects modules on SlangPy's {chosen.value} device, as "
            f"slax.config.reflection_device or {REFLECTION_ENV_VAR} asks, not on the device that "
            "runs the kernels: the module must compile for its target too. Where the error is "
            "about that target, unset it.)"
        ) from error
    return SlangModule(str(path), reflection, content)


def load_module_from_source(name: str, source: str) -> SlangModule:
    """Loads Slang ``source`` as module ``name``.

    The source is written to ``<cache dir>/sources/<name>.slang``, so that other modules can import
    it by name; ``name`` is a module name (letters, digits, ``_`` and ``-``), never a path. Loading
    another source under a name used before gives a module with the new code.

    Raises:
      ValueError: ``name`` is not a module name.
      OSError: the cache directory (``SLAX_CACHE_DIR``) cannot be written.
      slax.SlangCompileError: Slang rejected the source.
    """
    if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
        raise ValueError(
            "slax.load_module_from_source: name must be a module name of letters, digits, '_' and "
            f"'-', not starting with a digit or '-' (it names the file <name>.slang in slax's cache); "
            f"got {name!r}."
        )
    if not isinstance(source, str):
        raise TypeError(
            f"slax.load_module_from_source: source must be Slang source text (a str); got "
            f"{type(source).__name__}."
        )
    directory = writable_cache_dir("sources")
    path = directory / f"{name}.slang"
    if not path.exists() or path.read_text() != source:
        path.write_text(source)
    return load_module(path)


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _resolve(path_or_name: str | os.PathLike[str]) -> pathlib.Path:
    candidate = pathlib.Path(path_or_name)
    names = [candidate] if candidate.suffix else [candidate, candidate.with_suffix(".slang")]
    for name in names:
        for directory in (pathlib.Path.cwd(), SHADER_DIR):
            if (directory / name).is_file():
                return (directory / name).resolve()
    raise FileNotFoundError(
        f"slax.load_module: no Slang module {str(path_or_name)!r} in the working directory or on "
        f"the include path ({SHADER_DIR})."
    )


class SlangModule:
    """A loaded Slang module; each attribute is a :class:`SlangFunction`.

    It runs the code its file (and its imports) held when it was loaded, identified by ``content``
    (:mod:`slax._sources`); after an edit, ``slax.load_module`` again gives the new code.
    """

    def __init__(self, path: str, reflection: spy.SlangModule, content: str):
        self.path = path
        self.content = content
        self._reflection = reflection
        self._names = KernelNames(name_prefix(identifiers(content)))
        self._functions: dict[str, SlangFunction] = {}

    def __getattr__(self, name: str) -> SlangFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        function = self._functions.get(name)
        if function is None:
            found = self._reflection.layout.find_function_by_name(name)
            if found is None:
                raise AttributeError(
                    f"slax: Slang module {self.path!r} has no function {name!r}; check the "
                    "spelling, and that it is declared at module scope."
                )
            function = SlangFunction(self, name, found)
            self._functions[name] = function
        return function

    def __getitem__(self, name: str) -> SlangFunction:
        return getattr(self, name)

    def __dir__(self) -> list[str]:
        """Attributes and the Slang functions the module declares (for tab completion)."""
        return sorted(set(super().__dir__()) | set(self.function_names()))

    def function_names(self) -> list[str]:
        """The functions this module declares at module scope (entry points included), sorted.

        Slang's reflection finds a function by name but does not list generic ones, so the
        candidates come from the module's source and reflection confirms each.
        """
        source = pathlib.Path(self.path).read_text()
        layout = self._reflection.layout
        return sorted(
            name for name in _module_scope_calls(source) if layout.find_function_by_name(name) is not None
        )

    def kernel(self, entry: str) -> SlangKernel:
        """The compute entry point ``entry`` of this module, callable on JAX arrays.

        The entry point follows the slax calling convention (``shaders/slax/kernel.slang``).
        """
        return SlangKernel(self, entry)

    def __repr__(self) -> str:
        return f"SlangModule({self.path!r})"


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_INNERMOST_BLOCK = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]")
_DECLARED = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<(?:[^<>()]|<[^<>()]*>)*>)?\s*\(")


def _module_scope_calls(source: str) -> set[str]:
    """Names followed by a parameter list at the module scope of Slang ``source``: with comments,
    bodies (``{...}``) and attributes (``[...]``) removed, every function declaration, generic or
    not, reads ``name(`` or ``name<...>(``."""
    text = _COMMENTS.sub(" ", source)
    while True:
        stripped = _INNERMOST_BLOCK.sub(";", text)
        if stripped == text:
            break
        text = stripped
    return set(_DECLARED.findall(text))


__all__ = ["SlangModule", "load_module", "load_module_from_source"]
