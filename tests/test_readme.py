"""Every Python snippet in README.md runs as written, on one device kind (``one_device_kind``): what
they show runs on every route in the tests of the modules they call; here they are checked as text a
reader copies."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import jaxlib
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)

pytestmark = pytest.mark.one_device_kind


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 3


PARAGRAPH_WORDS = 80
"""The most words a README paragraph holds: a longer one is read twice, or skipped."""


def _prose_paragraphs(text: str) -> list[str]:
    """README's prose: its blocks between blank lines, outside code blocks, headings, tables and
    images, each list item a paragraph of its own (without its ``-``)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    blocks = [block.strip() for block in re.split(r"\n\s*\n", prose)]
    return [
        re.sub(r"^\s*- ", "", item)
        for block in blocks
        if block and not block.startswith(("#", "|", "!["))
        for item in re.split(r"\n(?=\s*- )", block)
    ]


def _words(paragraph: str) -> int:
    """Words as a reader sees them: a link counts its text, not its target."""
    return len(re.sub(r"\]\([^)]*\)", "]", paragraph).split())


def test_readme_paragraphs_are_short():
    paragraphs = _prose_paragraphs(README.read_text())
    long = {text[:70]: _words(text) for text in paragraphs if _words(text) > PARAGRAPH_WORDS}
    assert len(paragraphs) > 20 and not long, (
        f"split these README paragraphs (paragraphs or list items of at most {PARAGRAPH_WORDS} words): {long}"
    )


def test_paragraph_check_counts_prose_only():
    """The check above takes each list item alone, and skips code, headings, tables and link targets."""
    text = (
        "# A title\n\n```python\nx = 1\n```\n\n| a | b |\n|---|---|\n\n"
        "One [two](https://three/four five).\n\n- six\n- seven\n  eight\n"
    )
    assert [_words(paragraph) for paragraph in _prose_paragraphs(text)] == [2, 1, 2]


def test_snippets_run_in_order(monkeypatch):
    """README's snippets, in order, in one namespace, as a reader runs them (later ones build on
    earlier ones; a traceback names the snippet), as tests/test_docs.py runs each page's."""
    monkeypatch.chdir(README.parent)
    namespace: dict = {}
    for index, snippet in enumerate(SNIPPETS):
        exec(compile(snippet, f"README snippet {index}", "exec"), namespace)


NO_VULKAN_DRIVER = {"VK_DRIVER_FILES": "/nonexistent", "VK_ICD_FILENAMES": "/nonexistent"}
"""Hides every Vulkan driver from the Vulkan loader (it honours either variable) and from
scripts/setup.sh, which reads them as the loader does."""


def _this_environment_as_a_venv(tmp_path: pathlib.Path) -> pathlib.Path:
    """A virtual environment for scripts/setup.sh that is the one running the tests (its files
    linked) and counts as installed (stamps newer than pyproject.toml, CUDA tools marked present),
    so that the scripts install nothing and run this checkout (the tests' PYTHONPATH)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text((pathlib.Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "lib").symlink_to(pathlib.Path(sys.prefix) / "lib")
    jax_version = os.environ.get("SLAX_JAX_VERSION")
    (venv / (".slax-installed" + (f"-jax-{jax_version}" if jax_version else ""))).touch()
    # scripts/test.sh fetches CUDA tools unless they are marked installed; the README snippets
    # this test runs need none.
    (venv / "cuda-tools").mkdir()
    (venv / "cuda-tools" / f".installed-{jaxlib.__version__}").touch()
    return venv


@pytest.mark.slow
def test_the_two_commands_work_without_a_vulkan_driver_and_say_which_route(tmp_path, device_kind):
    """scripts/train.sh and scripts/test.sh on a machine whose Vulkan loader finds no driver:
    setup installs nothing (a C++ compiler is here), says slax uses SlangPy's CPU device, and
    both run on it and say so, the training run also what CPU routes are for."""
    if device_kind == "cuda":
        pytest.skip("a GPU machine: the two commands run on CUDA there, not on SlangPy's CPU device")
    env = {**os.environ, **NO_VULKAN_DRIVER, "SLAX_VENV": str(_this_environment_as_a_venv(tmp_path))}
    for variable in ("SLAX_DEVICE", "SLAX_TEST_DEVICES", "SLAX_INSTALL_LAVAPIPE"):
        env.pop(variable, None)
    root = README.parent

    def run(command: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)

    train = ["bash", "scripts/train.sh", "--steps", "20", "--chunk", "10", "--batch", "256"]
    trained = run([*train, "--out", str(tmp_path / "run")])
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    banner = "setup: no NVIDIA GPU here; slax runs its kernels on cpu (CPU)\n"
    assert banner in trained.stdout
    assert "Slang kernels on cpu (CPU), host-pointer route" in trained.stdout
    assert "polynomial: Slang kernels run on a CPU route here, which is for development and correctness" in (
        trained.stdout
    )
    assert "slax: no" not in trained.stderr, trained.stderr[-3000:]  # the default: no fallback note
    # One test that runs a kernel forward and backward (docs/functions.md's snippet): README's
    # snippets, which the suite runs itself, compile a minute of kernels more.
    snippet = ["tests/test_docs.py", "-k", "page_snippets_run and functions"]
    tested = run(["bash", "scripts/test.sh", "-p", "no:cacheprovider", *snippet])
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert "device kinds under test: cpu\n" in tested.stdout
    summary = tested.stdout.splitlines()[-1]
    assert " 1 passed" in summary, tested.stdout[-3000:]
