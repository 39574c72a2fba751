"""The API reference (docs/, built by scripts/docs.sh) covers every public name, each public
function's docstring states its arguments, result and errors, and every Python snippet in docs/
runs as written (docs/frameworks.md's: tests/test_frameworks.py)."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

import slax
import slax.nn
import slax.parallel
import slax.testing
from slax import Config
from slax._config import _SETTINGS

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md"))
DOCUMENTED = {name for page in PAGES for name in re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.M)}
"""The names the pages render with mkdocstrings (``::: slax.load_module``)."""

pytestmark = pytest.mark.one_device_kind

PUBLIC_MODULES = {
    "slax": slax,
    "slax.nn": slax.nn,
    "slax.testing": slax.testing,
    "slax.parallel": slax.parallel,
}


def _public_names() -> list[str]:
    """Every name of the public modules' ``__all__`` but the modules themselves (each a page)."""
    return [
        f"{prefix}.{name}"
        for prefix, module in PUBLIC_MODULES.items()
        for name in module.__all__
        if not inspect.ismodule(getattr(module, name))
    ]


def _rendered(name: str) -> bool:
    """Whether ``name`` is on a page: rendered itself, or by another public module's name for it,
    as ``slax.data_parallel`` is also ``slax.parallel.data_parallel``."""
    prefix, _, attribute = name.rpartition(".")
    obj = getattr(PUBLIC_MODULES[prefix], attribute)
    aliases = {f"{p}.{attribute}" for p, m in PUBLIC_MODULES.items() if getattr(m, attribute, None) is obj}
    if isinstance(obj, Config):  # slax.config: its class, slax.Config, documents its settings
        aliases.add("slax.Config")
    return bool(aliases & DOCUMENTED)


def test_every_public_name_is_in_the_reference():
    missing = [name for name in _public_names() if not _rendered(name)]
    assert not missing, f"add a '::: NAME' line for these to a page of docs/: {missing}"


def test_every_setting_is_documented():
    """Each ``slax.config`` setting has an entry in Config's docstring (rendered on the debugging
    page) and a row in that page's table of settings and environment variables."""
    assert "slax.Config" in DOCUMENTED
    table = (DOCS / "debugging.md").read_text()
    for setting in _SETTINGS:
        assert f"\n      {setting}: " in Config.__doc__, setting
        assert f"| `{setting}` |" in table, setting


def _public_callables():
    """Each public function, and each public method (``__call__`` and ``__getitem__`` included) of
    the public classes, with a name for messages."""
    for name in _public_names():
        prefix, _, attribute = name.rpartition(".")
        obj = getattr(PUBLIC_MODULES[prefix], attribute)
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in vars(obj).items():
                public = not member.startswith("_") or member in ("__call__", "__getitem__")
                if public and inspect.isfunction(value):
                    yield f"{name}.{member}", value


@pytest.mark.parametrize("name, function", list(_public_callables()), ids=[n for n, _ in _public_callables()])
def test_docstring_states_arguments_result_and_errors(name, function):
    """``Args:`` where it takes arguments, ``Returns:`` where it returns a value, ``Raises:`` where
    its own body raises."""
    doc = inspect.getdoc(function)
    assert doc, f"{name} has no docstring"
    signature = inspect.signature(function)
    if [p for p in signature.parameters if p != "self"]:
        assert "Args:" in doc, f"{name}'s docstring has no Args: section"
    if signature.return_annotation not in (inspect.Signature.empty, None, "None"):
        assert "Returns:" in doc, f"{name}'s docstring has no Returns: section"
    if re.search(r"^\s+raise \w", inspect.getsource(function), flags=re.M):
        assert "Raises:" in doc, f"{name}'s docstring has no Raises: section"


SNIPPET_PAGES = [page for page in PAGES if page.name != "frameworks.md" and "```python" in page.read_text()]


SLOW_PAGES = {"encoding.md"}
"""Pages whose snippets --quick leaves to the full run: they repeat what tests/test_hash_encoding.py
runs, at a quarter of a minute."""


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p for p in SNIPPET_PAGES],
    ids=lambda page: page.name,
)
def test_page_snippets_run(page, monkeypatch):
    """A page's snippets, in order, in one namespace, as a reader runs them from the repository."""
    monkeypatch.chdir(DOCS.parent)
    namespace: dict = {}
    for index, snippet in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)):
        exec(compile(snippet, f"{page.name} snippet {index}", "exec"), namespace)


def test_readme_links_resolve():
    """README.md's links into the repository (docs pages, BENCHMARKS.md, images) name files that
    exist: mkdocs checks the pages' links, not README's."""
    readme = DOCS.parent / "README.md"
    targets = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)", readme.read_text())
    missing = [target for target in targets if not (DOCS.parent / target).exists()]
    assert targets and not missing, missing
