"""slax/_jax_api.py: every private or experimental JAX API slax uses is where this JAX keeps it,
and nowhere else in slax is one imported. CI runs this file on every JAX release it tests (the
``jax_version`` marker), so a release that moves an API fails here, naming it."""

from __future__ import annotations

import ast
import os

import jax
import pytest
from _helpers import CUDA_TOOLS, ROOT, run_python

from slax import _jax_api

pytestmark = [pytest.mark.jax_version, pytest.mark.one_device_kind]


@pytest.mark.parametrize("path", sorted(_jax_api.PRIVATE_API.values()))
def test_jax_keeps_the_api_where_slax_looks(path):
    try:
        found = _jax_api.resolve(path)
    except _jax_api.JaxApiMovedError as moved:
        pytest.fail(str(moved))
    assert found is not None


def test_a_moved_api_is_named_with_the_jax_version():
    with pytest.raises(_jax_api.JaxApiMovedError) as raised:
        _jax_api.resolve("jax._src.dispatch.no_such_api")
    message = str(raised.value)
    assert "jax._src.dispatch.no_such_api" in message and jax.__version__ in message
    assert _jax_api.SUPPORTED_JAX in message and "slax/_jax_api.py" in message
    with pytest.raises(_jax_api.JaxApiMovedError, match="jax.no_such_module.f"):
        _jax_api.resolve("jax.no_such_module.f")


_PRIVATE_NAMESPACES = ("jax._src", "jax.interpreters", "jax.extend", "jax.experimental", "jaxlib")


def test_only_slax_jax_api_imports_private_jax():
    """Every import of a private or experimental JAX namespace in slax/ is in slax/_jax_api.py."""
    offenders = []
    for path in sorted((ROOT / "slax").rglob("*.py")):
        if path.name == "_jax_api.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith(_PRIVATE_NAMESPACES):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, offenders


def test_gpu_triton_is_absent_without_the_cuda_plugin():
    """The plain CPU jaxlib has no Triton launcher: gpu_triton() says so by returning None (the PTX
    route then refuses, saying to install the plugin), rather than raising JaxApiMovedError."""
    import jaxlib

    plugin = any(d.platform == "gpu" for d in jax.devices()) or "cuda" in jaxlib.__file__
    assert (_jax_api.gpu_triton() is None) != plugin


def test_gpu_triton_api_with_the_cuda_plugin():
    """With jaxlib's CUDA plugin (which scripts/test.sh installs beside the environment, matching
    its jaxlib), every name the PTX route uses from the Triton launcher is there."""
    tools = str(CUDA_TOOLS)
    if not os.path.isdir(os.path.join(tools, "jax_cuda12_plugin")):
        pytest.skip(f"needs jaxlib's CUDA plugin, which scripts/test.sh installs in {tools} (not there)")
    probe = "from slax import _jax_api; m = _jax_api.gpu_triton(); assert m is not None; print('found')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tools, str(ROOT)]), "JAX_PLATFORMS": "cpu"}
    result = run_python("-c", probe, env=env)
    assert result.returncode == 0 and "found" in result.stdout, result.stderr[-3000:]


def test_varying_axes_inside_shard_map():
    """The aval field that says which manual axes a value varies over (it moved between releases)."""
    mesh = jax.make_mesh((1,), ("d",))
    seen = {}

    def body(x):
        seen["axes"] = _jax_api.varying_axes(jax.typeof(x))
        return x

    x = jax.device_put(jax.numpy.ones(4), jax.sharding.NamedSharding(mesh, jax.P("d")))
    jax.shard_map(body, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"))(x)
    assert seen["axes"] == frozenset({"d"})
