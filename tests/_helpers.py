"""What several test files share: where the repository is, running Python in a fresh process,
making a thing once per test run for all its pytest-xdist workers, finding equations in a jaxpr,
parameters marked one combination at a time, and the MLP tests' random inputs, error measure and
float32 check against the reference."""

from __future__ import annotations

import fcntl
import functools
import itertools
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn

from slax.testing import away_from_kinks, compare

ROOT = pathlib.Path(__file__).resolve().parent.parent
"""The repository's root: experiments/, tests/scripts/ and shaders/ are under it."""
CUDA_TOOLS = pathlib.Path(os.environ.get("SLAX_TEST_CUDA_TOOLS", ROOT / ".venv" / "cuda-tools"))
"""NVIDIA's CUDA tools (NVRTC, ptxas, jaxlib's CUDA plugin) that scripts/test.sh installs beside the
environment, for the PTX route's tests on a machine without a GPU."""
NVRTC = CUDA_TOOLS / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"


def parameter_product(*axes, marks: Callable[[tuple], list] = lambda case: []) -> list:
    """The product of ``axes`` (lists of values) as the parameters of one
    ``pytest.mark.parametrize``, each combination carrying ``marks(combination)``: stacked
    parametrize decorators can mark a value only in every combination it is in, where CI's
    ``jax_version`` leg takes one combination and the second device kind a few (tests/conftest.py).
    Ids join the values' (a tuple's items joined by ``-``, a type's name)."""

    def name(value) -> str:
        if isinstance(value, tuple):
            return "-".join(map(str, value))
        return getattr(value, "__name__", str(value))

    return [
        pytest.param(*case, id="-".join(map(name, case)), marks=marks(case))
        for case in itertools.product(*axes)
    ]


def python_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the checkout and ``experiments/`` (the
    scripts' shared modules) in front of the import path: a fresh process imports the slax under
    test, not whichever one its environment has installed."""
    env = dict(os.environ if env is None else env)
    paths = [str(ROOT), str(ROOT / "experiments"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def path_with_tests() -> str:
    """``tests/`` (for ``-p conftest`` and ``_helpers``) in front of this process's import path,
    keeping what the environment put there: a GPU machine's bundles bring SlangPy and pytest-xdist
    that way, and a child run without them fails before it collects."""
    return os.pathsep.join(path for path in [str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")] if path)


def run_python(
    *arguments: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python *arguments`` in a fresh process from the repository root (:func:`python_env`), its
    output captured as text."""
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=python_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def once_per_run(request: pytest.FixtureRequest, name: str, make: Callable[[], str]) -> str:
    """``make()``'s text, made once per test run however many pytest-xdist workers ask for it: the
    first to ask makes it and writes it to ``name`` in the run's temporary directory, under a file
    lock; the others wait on the lock and read it. For what takes minutes to make and several tests
    read, wherever xdist sends them: xdist's ``--dist loadgroup`` cannot keep them on one worker
    (under pytest 9.2 it writes its group to ``Item._nodeid``, which pytest no longer reads, so the
    grouping is silently ignored).

    The run's directory: a worker's base temporary directory is ``popen-gwN`` under the
    controller's, so its parent is shared by this run's workers and by no other run; without xdist,
    the process's own base temporary directory. If ``make`` raises, nothing is written and the next
    worker to ask makes it again."""
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    if hasattr(request.config, "workerinput"):  # a pytest-xdist worker
        base = base.parent
    path = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        if not path.exists():
            path.write_text(make())
        return path.read_text()


def equations(jaxpr: Jaxpr, keep: Callable[[JaxprEqn], bool]) -> Iterator[JaxprEqn]:
    """Every equation of ``jaxpr`` that ``keep`` accepts, those of nested jaxprs (grad, custom_vjp,
    jit) included: where a transformation put a primitive is JAX's business, that it is there is
    the test's."""
    for equation in jaxpr.eqns:
        if keep(equation):
            yield equation
        for value in equation.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, (ClosedJaxpr, Jaxpr)):
                    yield from equations(getattr(item, "jaxpr", item), keep)


def draw_uniform(key, shape, dtype):
    """Values uniform in [-1, 1), drawn in float32 and rounded to ``dtype``."""
    return jax.random.uniform(key, shape, jnp.float32, -1.0, 1.0).astype(dtype)


def mlp_inputs(params, key, batch, dtype):
    """``batch`` random inputs of the network ``params``, none of them at a LeakyReLU kink
    (slax.testing.away_from_kinks), where a gradient has no single right value."""
    kept, attempt = [], 0
    while sum(len(k) for k in kept) < batch:
        shape = (batch + 64, params[0]["weight"].shape[1])
        draw = draw_uniform(jax.random.fold_in(key, attempt), shape, dtype)
        kept.append(away_from_kinks(params, draw))
        attempt += 1
    return jnp.concatenate(kept)[:batch]


def relative_error(got, want) -> float:
    """The largest normwise relative error over the leaves of ``got`` against ``want``
    (slax.testing.compare)."""
    return compare("", "", got, want, 0.0).max_rel_error


def compute_seconds() -> float:
    """The CPU seconds spent so far by this process (all its threads), by the children it has
    waited for (g++ building CPU kernels) and by slax's PTX compile worker while it runs (Linux's
    /proc): what a first call's compiles cost, which other processes on a busy machine stretch in
    wall time but not in CPU time (a test's pytest-xdist neighbours, the other route's run)."""
    from slax._ptx_compile import worker_pid

    times = os.times()
    seconds = times.user + times.system + times.children_user + times.children_system
    pid = worker_pid()
    if pid is not None:
        # /proc/PID/stat after the command's parenthesis: field 3 onwards; utime, stime are 14, 15.
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        seconds += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def assert_float32_mlp_matches_reference(
    sizes, seed: int, batch: int = 100, activation: str = "leaky_relu"
) -> None:
    """A float32 network of ``sizes`` (random, from ``seed``; ``activation`` on its hidden layers):
    mlp_apply's reverse-mode gradients (check_grads) and mlp_loss_and_grad's loss and gradients
    under jit against the reference's."""
    from slax import nn
    from slax.testing import RELATIVE_TOLERANCE, check_grads

    keys = jax.random.split(jax.random.key(seed), 3)
    params = nn.mlp_init(keys[0], sizes, activation=activation)
    x = mlp_inputs(params, keys[1], batch, "float32")
    target = draw_uniform(keys[2], (batch, sizes[-1]), "float32")
    reference = functools.partial(nn.mlp_apply_reference, storage_dtype="float32")
    check_grads(nn.mlp_apply, reference, params, x, modes=("rev",), raises=True)
    loss, grads = jax.jit(nn.mlp_loss_and_grad)(params, x, target)
    loss_ref, grads_ref = jax.value_and_grad(nn.mlp_loss_reference)(params, x, target)
    assert relative_error(loss, loss_ref) < RELATIVE_TOLERANCE["float32"]
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref), strict=True):
        assert relative_error(got, want) < RELATIVE_TOLERANCE["float32"]


def assert_loss_and_grad_match_reference(
    params, seed: int, tolerance: float, input_gradient: bool = False
) -> None:
    """A wide network's ``mlp_loss_and_grad`` (with ``input_gradient``, ``jax.value_and_grad`` of
    ``mlp_squared_error`` in the parameters and x), vmapped over two groups of 1000 samples, one
    of 333 and one of 5 (random inputs and targets from ``seed``; thread groups and warps of whole
    tiles, the last tile's rows past the group's end counting for nothing): each group's loss and
    gradients within ``tolerance`` of the float32 reference's at full precision (a float16
    network's activations rounded to half), and the same bits on a second run."""
    from _training import cast

    from slax import nn

    dtype = str(params[0]["weight"].dtype)
    sizes = (params[0]["weight"].shape[1], *(layer["weight"].shape[0] for layer in params))
    keys = jax.random.split(jax.random.key(seed), 2)
    argnums = (0, 1) if input_gradient else 0
    loss = functools.partial(nn.mlp_loss_reference, storage_dtype=dtype)
    reference = jax.jit(jax.value_and_grad(loss, argnums))
    fused = jax.value_and_grad(nn.mlp_squared_error, argnums) if input_gradient else nn.mlp_loss_and_grad
    function = jax.jit(jax.vmap(fused, in_axes=(None, 0, 0)))
    for groups, batch in ((2, 1000), (1, 333), (1, 5)):
        x = mlp_inputs(params, keys[0], groups * batch, dtype).reshape(groups, batch, sizes[0])
        target = draw_uniform(keys[1], (groups, batch, sizes[-1]), dtype)
        got = jax.tree.leaves(function(params, x, target))
        again = jax.tree.leaves(function(params, x, target))
        for k in range(groups):
            want = jax.tree.leaves(reference(*cast((params, x[k], target[k]), jnp.float32)))
            for leaf, repeat, wanted in zip(got, again, want, strict=True):
                assert np.array_equal(leaf[k], repeat[k]), "the sums are not deterministic"
                assert relative_error(leaf[k], wanted) < tolerance


def eikonal_loss(apply):
    """A signed-distance loss of the MLP ``apply(params, x)``: the outputs' squares plus 0.1 times
    the distance of the input gradient (of the outputs' sum) from unit norm. Its gradient in the
    parameters is second order in the network: the Hessian kernels' part along a direction in x."""

    def loss(params, x):
        gradient = jax.grad(lambda x: jnp.sum(apply(params, x).astype(jnp.float32)))(x)
        norm = jnp.linalg.norm(gradient.astype(jnp.float32), axis=-1)
        return jnp.mean(apply(params, x).astype(jnp.float32) ** 2) + 0.1 * jnp.mean((norm - 1.0) ** 2)

    return loss
