"""Every Python snippet in README.md runs as written."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index, monkeypatch):
    monkeypatch.chdir(README.parent)
    namespace: dict = {}
    for earlier in SNIPPETS[:index]:  # later snippets build on earlier ones, as a reader would
        exec(compile(earlier, f"README snippet {SNIPPETS.index(earlier)}", "exec"), namespace)
    exec(compile(SNIPPETS[index], f"README snippet {index}", "exec"), namespace)
