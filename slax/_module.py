"""Loading Slang modules (:func:`load_module`), whose functions become JAX-callable.

A :class:`SlangModule` hands out a :class:`slax._function.SlangFunction` per Slang function and a
:class:`slax._kernel.SlangKernel` per compute entry point.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re

import slangpy as spy

from slax._codegen import KernelNames, name_prefix
from slax._compile import load_slang_module, module_layout
from slax._config import REFLECTION_ENV_VAR
from slax._device import SHADER_DIR, reflection_device, reflection_override, writable_cache_dir
from slax._errors import SlangCompileError
from slax._function import SlangFunction
from slax._kernel import SlangKernel
from slax._sources import file_digest, identifiers, write_atomically


def load_module(path_or_name: str | os.PathLike[str]) -> SlangModule:
    """Loads a Slang module whose functions become JAX-callable.

    Args:
      path_or_name: a ``.slang`` file path, or a module name found on the include path
        (slax's ``shaders/`` directory), e.g. ``"poly"`` or ``"poly.slang"``.

    Returns:
      The module: ``module.name`` (or ``module["name"]``) is its Slang function ``name``, a
      :class:`SlangFunction`; ``module.kernel("entry")`` its compute entry point ``entry``.

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

    The module is built from ``<cache dir>/sources/<digest of source>/<name>.slang``: a file per
    content, never rewritten with other text, so two threads or processes loading other sources
    under the same name each get their own. The source is also published as
    ``<cache dir>/sources/<name>.slang``, on the include path after slax's and SlangPy's shader
    directories, so that other modules can ``import name;``: they import the source last loaded
    under that name.

    Args:
      name: the module's name, as other modules ``import`` it: letters, digits, ``_`` and ``-``,
        not starting with a digit or ``-``; never a path.
      source: the module's Slang source text.

    Returns:
      The module, as :func:`load_module` returns it.

    Raises:
      ValueError: ``name`` is not a module name.
      TypeError: ``source`` is not a ``str``.
      OSError: the cache directory (``SLAX_CACHE_DIR``) cannot be written.
      RuntimeError: the module's file held other text when Slang read it (another program wrote it).
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
    data = source.encode()
    digest = hashlib.sha256(data).hexdigest()
    directory = writable_cache_dir("sources")
    path = directory / digest[:32] / f"{name}.slang"
    path.parent.mkdir(exist_ok=True)
    for target in (path, directory / f"{name}.slang"):
        if not target.is_file() or target.read_bytes() != data:
            write_atomically(target, data)
    module = load_module(path)
    if file_digest(module.content, module.path) != digest:
        raise RuntimeError(
            f"slax.load_module_from_source: {path} held other text than the source of module "
            f"{name!r} when Slang read it; something else writes slax's cache. Stop it, delete "
            f"{path.parent} and load the module again."
        )
    return module


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
    """A loaded Slang module: ``module["name"]`` is its Slang function ``name``, a
    :class:`SlangFunction`, and so is ``module.name`` where slax's own attributes leave it free.

    Item access reaches every function. Attribute access reaches those whose name neither begins
    with ``_`` (kept for Python's and slax's private names) nor is one of the module object's own
    attributes (``kernel``, ``path``, ``content``, ``function_names``): ``module.kernel`` is
    always :meth:`kernel`. ``dir(module)`` lists what attribute access gives: the module object's
    attributes and the functions reachable as attributes; :meth:`function_names` lists them all.

    It runs the code its file (and its imports) held when it was loaded, identified by ``content``
    (:mod:`slax._sources`); after an edit, ``slax.load_module`` again gives the new code.
    """

    def __init__(self, path: str, reflection: spy.SlangModule, content: str):
        self.path = path
        self.content = content
        self._reflection = reflection
        self._layout = module_layout(reflection)
        self._names = KernelNames(name_prefix(identifiers(content)))
        self._functions: dict[str, SlangFunction] = {}

    def __getitem__(self, name: str) -> SlangFunction:
        """The module's Slang function ``name``, whatever its name (``module["kernel"]``,
        ``module["_helper"]``).

        Args:
          name: the function's name in the module.

        Returns:
          The function, a :class:`SlangFunction`.

        Raises:
          KeyError: the module declares no function ``name`` at module scope.
          TypeError: the function is overloaded (slax does not choose between overloads).
        """
        function = self._function(name)
        if function is None:
            raise KeyError(self._missing(name))
        return function

    def __getattr__(self, name: str) -> SlangFunction:
        # Reached only for names that are not the object's own attributes.
        if name.startswith("__") or "_layout" not in self.__dict__:
            raise AttributeError(name)
        if name.startswith("_") and self._declares(name):
            raise AttributeError(
                f"slax: the Slang function {name!r} of {self.path!r} begins with '_', which attribute "
                f"access keeps for Python's own names; call it as module[{name!r}]."
            )
        function = None if name.startswith("_") else self._function(name)
        if function is None:
            raise AttributeError(self._missing(name))
        return function

    def __dir__(self) -> list[str]:
        """The module object's attributes and the Slang functions reachable as attributes (for tab
        completion); those beginning with ``_`` are reached as ``module["_name"]``."""
        return sorted(set(super().__dir__()) | {n for n in self.function_names() if not n.startswith("_")})

    def _declares(self, name: str) -> bool:
        return self._layout.find_function_by_name(name) is not None

    def _function(self, name: str) -> SlangFunction | None:
        function = self._functions.get(name)
        if function is None:
            found = self._layout.find_function_by_name(name)
            if found is None:
                return None
            function = self._functions.setdefault(name, SlangFunction(self, name, found))
        return function

    def _missing(self, name: str) -> str:
        return (
            f"slax: Slang module {self.path!r} has no function {name!r}; check the spelling, and "
            "that it is declared at module scope."
        )

    def function_names(self) -> list[str]:
        """The functions this module declares at module scope (entry points included), sorted:
        every name ``module[name]`` reaches, those attribute access leaves to slax included.

        Returns:
          The functions' names, sorted.

        Slang's reflection finds a function by name but does not list generic ones, so the
        candidates come from the module's source and reflection confirms each.
        """
        source = pathlib.Path(self.path).read_text()
        return sorted(name for name in _module_scope_calls(source) if self._declares(name))

    def kernel(self, entry: str) -> SlangKernel:
        """The compute entry point ``entry`` of this module, callable on JAX arrays.

        The entry point follows the slax calling convention (``shaders/slax/kernel.slang``).

        Args:
          entry: the name of a ``[shader("compute")]`` entry point of this module.

        Returns:
          The kernel, a :class:`SlangKernel`; calling it launches the entry point.

        Raises:
          TypeError: ``entry`` is not a ``str`` (a module's Slang function named ``kernel`` is
            ``module["kernel"]``).
          ValueError: the module has no such entry point, declares global shader parameters, or
            the entry point takes a parameter that is neither a pointer nor a scalar.
        """
        if not isinstance(entry, str):
            shadowed = self._declares("kernel")
            hint = " The module's Slang function 'kernel' is module['kernel']." if shadowed else ""
            raise TypeError(
                f"slax: SlangModule.kernel() takes the name of a compute entry point (a str); got "
                f"{type(entry).__name__}.{hint}"
            )
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
