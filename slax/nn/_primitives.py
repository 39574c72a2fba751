"""The MLP's JAX primitives: forward, backward and fused loss-and-gradient, the tangent (the
network's Jacobian-vector product) that links forward and backward in JAX's differentiation, and
the backward pass's tangent (a Hessian-vector product, its own transpose) that second derivatives
take.

Each takes the input batch (and ``dy`` or the target), then every layer's bias and weight, and
lowers, per platform, through the backend that :func:`slax.nn._backends.choose` picks there for
its static ``arch`` (:class:`~slax.nn._architecture.Architecture`) and ``request`` (the user's
:class:`~slax.nn._backends.BackendRequest`, as the call was traced): one launch of a Slang kernel,
or XLA's own products; the tangent lowers to its plain-JAX twin (slax/nn/_reference.py).
``group_ndim`` leading axes of the data are groups (vmapped calls) whose gradients are summed
apart.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from slax._jax_api import Zero, instantiate_zeros, is_undefined_primal, lower_fun
from slax._primitive import check_finite, declare_primitive, result_aval
from slax.nn._backends import choose, linear_pieces
from slax.nn._kernels import hidden_width
from slax.nn._precision import twin_precision
from slax.nn._reference import backward_tangent_twin, forward_twin, tangent_twin

PLATFORMS = ("cpu", "cuda")
"""Where the MLP's primitives lower, each platform through the backend :func:`choose` picks there."""


def _param_shapes(arch):
    """Each layer's bias and weight, the order the primitives take and return them in."""
    return [shape for i, o in arch.layers for shape in ((o,), (o, i))]


def _grad_shapes(x, arch, group_ndim):
    groups = x.shape[:group_ndim]
    return [groups + shape for shape in _param_shapes(arch)]


# --- forward ------------------------------------------------------------------------------------


def _forward_shapes(x, arch, keep_hidden):
    """The forward pass's results: the output, and with ``keep_hidden`` the hidden activations
    (slax/nn/_kernels.py, ``hidden_width``)."""
    shapes = [x.shape[:-1] + (arch.sizes[-1],)]
    return shapes + [x.shape[:-1] + (hidden_width(arch.sizes),)] if keep_hidden else shapes


def _forward_abstract_eval(x, *params, arch, keep_hidden, request, routes):
    return [result_aval(shape, arch.dtype, (x, *params)) for shape in _forward_shapes(x, arch, keep_hidden)]


def _forward(x, *params, arch, keep_hidden, request, routes, platform):
    choice = choose(arch, platform, math.prod(x.shape[:-1]), request)
    return choice.backend.forward(arch, choice.platform, x, params, keep_hidden, routes)


# --- gradients ----------------------------------------------------------------------------------


def _backward_abstract_eval(
    *operands, arch, group_ndim, hidden, input_gradient, param_output, request, routes
):
    x = operands[0]
    dx = [result_aval(x.shape, x.dtype, operands)] if input_gradient else []
    sums = _grad_shapes(x, arch, group_ndim) if param_output else []
    return dx + [result_aval(shape, jnp.float32, operands) for shape in sums]


def _loss_grad_abstract_eval(
    x, target, *params, arch, group_ndim, loss_scale, input_gradient, request, routes
):
    operands = (x, target, *params)
    dx = [result_aval(x.shape, x.dtype, operands)] if input_gradient else []
    return [result_aval(x.shape[:group_ndim], jnp.float32, operands), *dx] + [
        result_aval(shape, jnp.float32, operands) for shape in _grad_shapes(x, arch, group_ndim)
    ]


def _backward(*operands, arch, group_ndim, hidden, input_gradient, param_output, request, routes, platform):
    """``x, [hidden,] dy, *params -> [dx,] [*grads]``: with ``hidden``, from the hidden activations
    the forward pass kept (``mlp_forward_p`` with ``keep_hidden``); ``dx`` only with
    ``input_gradient`` (else ``mlp_backward_params``, which computes none), the gradients only with
    ``param_output``."""
    num_data = 3 if hidden else 2
    data, params = operands[:num_data], operands[num_data:]
    choice = choose(arch, platform, math.prod(data[0].shape[:-1]), request)
    return choice.backend.backward(
        arch, choice.platform, data, params, group_ndim, input_gradient, param_output, routes
    )


def _backward_dead_code(used_outputs: list[bool], equation):
    """jax.jit's dead-code elimination of a backward launch: where nothing reads ``dx`` (a gradient
    of the parameters alone, as a training step takes it), the launch of ``mlp_backward_params``,
    which computes none (for wide networks, a quarter of the backward products fewer); where
    nothing reads the parameters' gradients (the input gradient inside an eikonal loss), a launch
    without them (``param_output`` off: the backends that can skip their sums do); where nothing
    reads any result, none."""
    if not any(used_outputs):
        return [False] * len(equation.invars), None
    params, outvars = dict(equation.params), list(equation.outvars)
    if params["input_gradient"] and not used_outputs[0]:
        params["input_gradient"] = False
        outvars, used_outputs = outvars[1:], used_outputs[1:]
    sums = slice(1 if params["input_gradient"] else 0, None)
    if params["param_output"] and not any(used_outputs[sums]):
        params["param_output"] = False
        outvars = outvars[: sums.start]
    return [True] * len(equation.invars), equation.replace(params=params, outvars=outvars)


def _loss_grad(x, target, *params, arch, group_ndim, loss_scale, input_gradient, request, routes, platform):
    """``[loss, [dx,] *grads]`` per group: with ``input_gradient``, the loss's gradient at each
    sample's input too (``slax.nn.mlp_squared_error``'s)."""
    choice = choose(arch, platform, math.prod(x.shape[:-1]), request)
    run = choice.backend.loss_input_grad if input_gradient else choice.backend.loss_grad
    return run(arch, choice.platform, x, target, params, group_ndim, loss_scale, routes)


def _loss_and_grad_is_not_differentiable(primals, tangents, **params):
    if params["input_gradient"]:
        raise TypeError(
            "slax.nn.mlp_squared_error is differentiable once, in reverse mode (jax.grad, jax.vjp, "
            "jax.value_and_grad): its gradient comes from one Slang pass. For forward mode "
            "(jax.jvp) or second derivatives (jax.hessian, a gradient of its gradient), write the "
            "loss with slax.nn.mlp_apply, which JAX differentiates to any order: "
            "jnp.mean(jnp.sum((nn.mlp_apply(params, x) - target) ** 2, -1))."
        )
    raise TypeError(
        "slax.nn.mlp_loss_and_grad already returns the loss's gradient (from one Slang pass) and "
        "cannot itself be differentiated (jax.grad, jax.jvp, jax.hessian): use the gradient it "
        "returns, or to differentiate a loss of your own, write it "
        "with slax.nn.mlp_apply, which jax.grad differentiates: "
        "jax.grad(lambda p: jnp.mean(jnp.sum((nn.mlp_apply(p, x) - target) ** 2, -1)))(params)."
    )


# --- derivatives ---------------------------------------------------------------------------------
#
# mlp_forward_p's JVP emits mlp_tangent_p, the network's Jacobian-vector product, linear in its
# tangents, whose transpose is the backward kernel: jax.grad runs the forward and backward kernels,
# and jax.jvp the forward kernel and the twin's tangent. Each first-order primitive is linear in
# some operands (mlp_tangent_p in the tangents, mlp_backward_p in dy), and its JVP is the same
# primitive along those operands' tangents plus its plain-JAX twin's derivative along the rest
# (:func:`_linear_map_jvp`), which JAX differentiates and transposes further: derivatives of any
# order, with the kernels where a derivative is first order in the network.


def _forward_jvp(primals, tangents, *, arch, keep_hidden, request, routes):
    """The forward kernel, keeping the hidden activations the backward kernel reads where the
    network has them (``hidden_width``), and mlp_tangent_p. Where the forward call kept them itself
    (an outer derivative of this rule: a second derivative), their tangent is the twin's."""
    x, *params = primals
    outputs = mlp_forward_p.bind(
        x, *params, arch=arch, keep_hidden=hidden_width(arch.sizes) > 0, request=request, routes=routes
    )
    y, hidden = outputs[0], outputs[1:]
    dx, *dparams = [instantiate_zeros(t) for t in tangents]
    dy = mlp_tangent_p.bind(
        x, *hidden, dx, *params, *dparams, arch=arch, hidden=bool(hidden), request=request, routes=routes
    )
    if not keep_hidden:
        return [y], dy
    _, (_, dhidden) = jax.jvp(
        functools.partial(
            forward_twin,
            dtype=arch.dtype,
            activations=arch.activations,
            precision=twin_precision(arch.dtype, request.products),
        ),
        list(primals),
        [dx, *dparams],
    )
    return outputs, [*dy, dhidden]


def _tangent_operands(operands, hidden: bool):
    """``x, [hidden], dx, *params, *dparams`` of mlp_tangent_p, split."""
    kept = 1 + hidden
    x, rest = operands[0], operands[1:]
    count = (len(rest) - kept) // 2
    return x, rest[: kept - 1], rest[kept - 1], rest[kept : kept + count], rest[kept + count :]


def _tangent_abstract_eval(*operands, arch, hidden, request, routes):
    x = operands[0]
    return [result_aval(x.shape[:-1] + (arch.sizes[-1],), arch.dtype, operands)]


def _tangent(*operands, arch, hidden, request, routes):
    """mlp_tangent_p's value, from its twin (no kernel computes a Jacobian-vector product)."""
    x, _, dx, params, dparams = _tangent_operands(operands, hidden)
    precision = twin_precision(arch.dtype, request.products)
    return [tangent_twin(x, dx, params, dparams, arch.dtype, arch.activations, precision)]


def _tangent_transpose(cotangents, *operands, arch, hidden, request, routes):
    """The backward kernel: ``dy -> dx, *dparams`` (``dx`` only where it is wanted)."""
    x, kept, dx, params, dparams = _tangent_operands(operands, hidden)
    _refuse_nonlinear("mlp_tangent", [x, *kept, *params])
    (dy,) = cotangents
    if type(dy) is Zero:
        return [None] * len(operands)
    input_gradient = is_undefined_primal(dx)
    dy = instantiate_zeros(dy).astype(arch.dtype)
    outputs = mlp_backward_p.bind(
        x,
        *kept,
        dy,
        *params,
        arch=arch,
        group_ndim=0,
        hidden=hidden,
        input_gradient=input_gradient,
        param_output=True,
        request=request,
        routes=routes,
    )
    check_finite("slax.nn.mlp_apply's backward kernel", [x, *kept, dy, *params], outputs)
    dx_cotangent = outputs.pop(0) if input_gradient else None
    grads = [g.astype(t.aval.dtype) if is_undefined_primal(t) else None for g, t in zip(outputs, dparams)]
    return [None] * (1 + len(kept)) + [dx_cotangent] + [None] * len(params) + grads


def _tangent_jvp(primals, tangents, **params):
    kept = 1 + params["hidden"]
    count = (len(primals) - kept - 1) // 2  # parameters, and as many tangents
    linear = [False] * kept + [True] + [False] * count + [True] * count
    return _linear_map_jvp(mlp_tangent_p, _tangent, linear, primals, tangents, params)


def _backward_jvp(primals, tangents, **params):
    """The backward launch's JVP, a second derivative: the launch again along ``dy``'s tangent (it
    is linear in ``dy``), plus :data:`mlp_backward_tangent_p` along the tangents of ``x`` and the
    parameters. The kept hidden activations' tangent is not read: they are the forward pass's of
    ``x`` and the parameters, whose tangents carry it."""
    hidden, group_ndim = params["hidden"], params["group_ndim"]
    x, kept, dy, weights = primals[0], primals[1 : 1 + hidden], primals[1 + hidden], primals[2 + hidden :]
    tx, tdy, tweights = tangents[0], tangents[1 + hidden], tangents[2 + hidden :]
    outputs = mlp_backward_p.bind(*primals, **params)
    terms = []
    if type(tdy) is not Zero:
        terms.append(mlp_backward_p.bind(x, *kept, instantiate_zeros(tdy), *weights, **params))
    x_direction = type(tx) is not Zero
    param_direction = any(type(t) is not Zero for t in tweights)
    if x_direction or param_direction:
        groups = x.shape[:group_ndim]
        directions = [
            jnp.broadcast_to(instantiate_zeros(t), groups + w.shape) for t, w in zip(tweights, weights)
        ]
        terms.append(
            mlp_backward_tangent_p.bind(
                x,
                dy,
                instantiate_zeros(tx),
                *directions,
                *weights,
                arch=params["arch"],
                group_ndim=group_ndim,
                input_gradient=params["input_gradient"],
                x_direction=x_direction,
                param_direction=param_direction,
                param_output=params["param_output"],
                request=params["request"],
                routes=params["routes"],
            )
        )
    if not terms:
        return outputs, [Zero(jax.typeof(o).to_tangent_aval()) for o in outputs]
    return outputs, [functools.reduce(jnp.add, parts) for parts in zip(*terms)]


def _backward_transpose(
    cotangents, *operands, arch, group_ndim, hidden, input_gradient, param_output, request, routes
):
    """The Jacobian-vector product: ``dx, *dparams -> dy``, per group for vmapped groups."""
    x, kept, dy, params = operands[0], operands[1 : 1 + hidden], operands[1 + hidden], operands[2 + hidden :]
    _refuse_nonlinear("mlp_backward", [x, *kept, *params])
    cotangents = list(cotangents)
    dx = cotangents.pop(0) if input_gradient else Zero(jax.typeof(x).to_tangent_aval())
    if all(type(c) is Zero for c in [dx, *cotangents]):  # no sums' cotangents without param_output
        return [None] * len(operands)

    def tangent(x, kept, dx, dparams):
        return mlp_tangent_p.bind(
            x, *kept, dx, *params, *dparams, arch=arch, hidden=hidden, request=request, routes=routes
        )[0]

    for _ in range(group_ndim):  # each group's parameter cotangent is its own tangent
        tangent = jax.vmap(tangent)
    if param_output:
        dparams = [instantiate_zeros(c).astype(p.dtype) for c, p in zip(cotangents, params)]
    else:
        dparams = [jnp.zeros(x.shape[:group_ndim] + p.shape, p.dtype) for p in params]
    dy_cotangent = tangent(x, list(kept), instantiate_zeros(dx).astype(x.dtype), dparams)
    return [None] * (1 + len(kept)) + [dy_cotangent.astype(dy.aval.dtype)] + [None] * len(params)


# mlp_backward_tangent_p is the backward launch's JVP in x and the parameters at a fixed dy: per
# sample, the Hessian of dy . network(x, params) times the direction (x_direction, the group's
# param_directions). A Hessian is symmetric, so the primitive is its own transpose: the cotangents of
# its results are the directions of the same product (:func:`_backward_tangent_transpose`). The
# gradient of an eikonal loss takes its parameters' part along a direction in x alone, which a
# backend may run as one kernel (``Backend.hessian_sums``); for a network of linear pieces the part
# in x along x is zero (:func:`_backward_tangent`); everything else runs the twin.


def _backward_tangent_operands(operands):
    """``x, dy, x_direction, *param_directions, *params`` of mlp_backward_tangent_p, split."""
    count = (len(operands) - 3) // 2
    return operands[0], operands[1], operands[2], list(operands[3 : 3 + count]), list(operands[3 + count :])


def _backward_tangent_abstract_eval(*operands, arch, group_ndim, input_gradient, param_output, **_):
    x = operands[0]
    dx = [result_aval(x.shape, x.dtype, operands)] if input_gradient else []
    sums = _grad_shapes(x, arch, group_ndim) if param_output else []
    return dx + [result_aval(shape, jnp.float32, operands) for shape in sums]


def _backward_tangent_twin(
    *operands, arch, group_ndim, input_gradient, x_direction, param_direction, param_output, request, routes
):
    """mlp_backward_tangent_p's value from its twin, in XLA's products at the twins' precision."""
    x, dy, x_dir, param_dirs, params = _backward_tangent_operands(operands)
    return backward_tangent_twin(
        x,
        dy,
        x_dir if x_direction else None,
        param_dirs if param_direction else None,
        params,
        arch.dtype,
        arch.activations,
        group_ndim,
        input_gradient,
        param_output,
        twin_precision(arch.dtype, request.products),
    )


def _backward_tangent(*operands, platform, **params):
    """mlp_backward_tangent_p's value: the parameters' part along a direction in x alone from the
    Hessian kernel of the backend that runs the network's first-order operations there
    (``Backend.hessian_sums``), where it has one; else the twin.

    Along x alone, a network whose activations are linear pieces has an input gradient constant in
    x wherever it has one, so its part in x (``input_gradient``) is zero: what the twin's products
    give too. A model that feeds a trained encoding to the network (an SDF behind a hash grid,
    whose eikonal gradient reaches the tables through the features) asks for it with the
    parameters' part, which then still runs on the Hessian kernel."""
    x, dy, x_dir, _, params_ = _backward_tangent_operands(operands)
    arch = params["arch"]
    along_x_alone = params["x_direction"] and not params["param_direction"]
    input_part = params["input_gradient"]
    if along_x_alone and params["param_output"] and (not input_part or linear_pieces(arch)):
        choice = choose(arch, platform, math.prod(x.shape[:-1]), params["request"])
        sums = choice.backend.hessian_sums(
            arch,
            choice.platform,
            x,
            x_dir,
            dy.astype(arch.dtype),
            params_,
            params["group_ndim"],
            params["routes"],
        )
        if sums is not None:
            return [jnp.zeros_like(x)] * input_part + sums
    return _backward_tangent_twin(*operands, **params)


def _backward_tangent_transpose(cotangents, *operands, **params):
    """The same Hessian-vector product, along the cotangents: ``dx``'s as the direction in ``x``,
    the parameters' (per group) as theirs; results for the directions being transposed."""
    x, dy, x_dir, param_dirs, weights = _backward_tangent_operands(operands)
    _refuse_nonlinear("mlp_backward_tangent", [x, dy, *weights])
    cotangents = list(cotangents)
    dx = cotangents.pop(0) if params["input_gradient"] else Zero(jax.typeof(x).to_tangent_aval())
    sums = cotangents if params["param_output"] else [Zero(jax.typeof(w).to_tangent_aval()) for w in weights]
    want_x = is_undefined_primal(x_dir)
    want_params = any(is_undefined_primal(p) for p in param_dirs)
    along_x = type(dx) is not Zero
    along_params = any(type(c) is not Zero for c in sums)
    if not (want_x or want_params) or not (along_x or along_params):
        return [None] * len(operands)
    dtypes = [p.aval.dtype if is_undefined_primal(p) else p.dtype for p in param_dirs]
    groups = x.shape[: params["group_ndim"]]
    outputs = mlp_backward_tangent_p.bind(
        x,
        dy,
        instantiate_zeros(dx).astype(x.dtype),
        # float32 directions: the sums' cotangents, not rounded to the parameters' dtype
        *[
            jnp.broadcast_to(instantiate_zeros(c).astype(jnp.float32), groups + w.shape)
            for c, w in zip(sums, weights)
        ],
        *weights,
        **{
            **params,
            "input_gradient": want_x,
            "x_direction": along_x,
            "param_direction": along_params,
            "param_output": want_params,
        },
    )
    x_cotangent = outputs.pop(0) if want_x else None
    if want_params:
        param_cotangents = [
            g.astype(d) if is_undefined_primal(p) else None for g, p, d in zip(outputs, param_dirs, dtypes)
        ]
    else:
        param_cotangents = [None] * len(param_dirs)
    return [None, None, x_cotangent, *param_cotangents] + [None] * len(weights)


def _backward_tangent_jvp(primals, tangents, **params):
    """Linear in the directions: itself along theirs, and its twin's derivative along the rest
    (third derivatives and beyond)."""
    count = (len(primals) - 3) // 2
    linear = [False, False, True] + [True] * count + [False] * count
    return _linear_map_jvp(mlp_backward_tangent_p, _backward_tangent_twin, linear, primals, tangents, params)


def _batch_backward_tangent(primitive, args, dims, **params):
    """vmap over the data or the directions adds a group axis (each parameter direction is a
    group's already); over the parameters, a launch per example."""
    return _batch_per_sample(primitive, args, dims, num_data=3 + (len(args) - 3) // 2, **params)


def _linear_map_jvp(primitive, twin, linear, primals, tangents, params):
    """The JVP of ``primitive``, linear in the operands ``linear`` marks: the primitive along those
    operands' tangents, plus the derivative of ``twin`` (its plain-JAX twin, called as the
    primitive is) along the other operands' tangents at the same linear operands."""
    outputs = primitive.bind(*primals, **params)
    terms = []
    if any(is_linear and type(t) is not Zero for is_linear, t in zip(linear, tangents)):
        along = [instantiate_zeros(t) if lin else p for p, t, lin in zip(primals, tangents, linear)]
        terms.append(primitive.bind(*along, **params))
    if any(not is_linear and type(t) is not Zero for is_linear, t in zip(linear, tangents)):
        fixed = [p for p, is_linear in zip(primals, linear) if is_linear]
        varied = [p for p, is_linear in zip(primals, linear) if not is_linear]
        directions = [instantiate_zeros(t) for t, is_linear in zip(tangents, linear) if not is_linear]

        def of_varied(*values):
            values, linear_values = iter(values), iter(fixed)
            merged = [next(linear_values) if is_linear else next(values) for is_linear in linear]
            return twin(*merged, **params)

        terms.append(jax.jvp(of_varied, varied, directions)[1])
    return outputs, [functools.reduce(jnp.add, parts) for parts in zip(*terms)]


def _refuse_nonlinear(name: str, operands) -> None:
    """The transposes are linear maps of their tangent operands; JAX transposes nothing else."""
    undefined = [k for k, operand in enumerate(operands) if is_undefined_primal(operand)]
    if undefined:
        raise ValueError(f"slax: {name} is not linear in its operands {undefined}; it cannot be transposed.")


# --- batching -----------------------------------------------------------------------------------


def _move_to_front(args, dims, size):
    """Batch axis first on every argument (broadcast where unbatched)."""
    return [
        jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size,) + a.shape)
        for a, d in zip(args, dims)
    ]


def _batch_size(args, dims):
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def _batch_per_sample(primitive, args, dims, *, num_data, **params):
    """vmap over data (not parameters) adds a leading group axis: one kernel launch for all."""
    size = _batch_size(args, dims)
    if any(d is not None for d in dims[num_data:]):
        return _batch_by_loop(primitive, args, dims, **params)
    data = _move_to_front(args[:num_data], dims[:num_data], size)
    if "group_ndim" in params:
        params = {**params, "group_ndim": params["group_ndim"] + 1}
    outputs = primitive.bind(*data, *args[num_data:], **params)
    return outputs, ([0] * len(outputs) if primitive.multiple_results else 0)


def _batch_backward(primitive, args, dims, **params):
    return _batch_per_sample(primitive, args, dims, num_data=3 if params["hidden"] else 2, **params)


def _batch_tangent(primitive, args, dims, **params):
    """vmap over data folds into the samples (one call, transposed to one backward launch); over
    parameters or their tangents it maps the twin, which mlp_tangent_p runs anyway."""
    num_data = 3 if params["hidden"] else 2
    if all(d is None for d in dims[num_data:]):
        return _batch_per_sample(primitive, args, dims, num_data=num_data, **params)
    return jax.vmap(functools.partial(_tangent, **params), in_axes=tuple(dims))(*args), [0]


def _batch_by_loop(primitive, args, dims, **params):
    """Per-example parameters: one launch per example, in a lax.map."""
    size = _batch_size(args, dims)
    stacked = _move_to_front(args, dims, size)
    outputs = jax.lax.map(lambda sliced: primitive.bind(*sliced, **params), stacked)
    return outputs, ([0] * len(outputs) if primitive.multiple_results else 0)


mlp_forward_p = declare_primitive(
    "slang_mlp_forward",
    abstract_eval=_forward_abstract_eval,
    lowering=lower_fun(_forward, multiple_results=True),
    platforms=PLATFORMS,
    batching_rule=functools.partial(_batch_per_sample, num_data=1),
    jvp=_forward_jvp,
)
mlp_backward_p = declare_primitive(
    "slang_mlp_backward",
    abstract_eval=_backward_abstract_eval,
    lowering=lower_fun(_backward, multiple_results=True),
    platforms=PLATFORMS,
    batching_rule=_batch_backward,
    dead_code=_backward_dead_code,
    jvp=_backward_jvp,
    transpose=_backward_transpose,
)
mlp_tangent_p = declare_primitive(
    "slang_mlp_tangent",
    abstract_eval=_tangent_abstract_eval,
    lowering=lower_fun(_tangent, multiple_results=True),
    batching_rule=_batch_tangent,
    jvp=_tangent_jvp,
    transpose=_tangent_transpose,
)
mlp_backward_tangent_p = declare_primitive(
    "slang_mlp_backward_tangent",
    abstract_eval=_backward_tangent_abstract_eval,
    lowering=lower_fun(_backward_tangent, multiple_results=True),
    platforms=PLATFORMS,
    batching_rule=_batch_backward_tangent,
    jvp=_backward_tangent_jvp,
    transpose=_backward_tangent_transpose,
)
mlp_loss_grad_p = declare_primitive(
    "slang_mlp_loss_grad",
    abstract_eval=_loss_grad_abstract_eval,
    lowering=lower_fun(_loss_grad, multiple_results=True),
    platforms=PLATFORMS,
    batching_rule=functools.partial(_batch_per_sample, num_data=2),
    jvp=_loss_and_grad_is_not_differentiable,
)
