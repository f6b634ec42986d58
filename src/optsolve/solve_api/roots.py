"""``solve`` for a :class:`~optsolve.RootProblem`: validate, hand the algorithm's backend the
problem in the form it takes, judge the result by ``max|F(x)| <= ftol``, and differentiate
``x*(p)`` by the implicit function theorem.

The forms (an algorithm's ``solves_roots`` trait,
:func:`~optsolve.solve_api.root_problem.root_form`):

- "field": the JAX-native root finders run on the shared driver with the problem's
  :class:`~optsolve.solve_api.root_problem.RootSystem`, whose gradient field is F, so the
  driver's gradient test, given ``ftol`` as its gtol, is the root test;
- "residuals": the least-squares methods (:class:`~optsolve.LevenbergMarquardt`) minimise
  ``0.5 |F|^2`` as they would any residuals, with their own stopping tests;
- "scipy": scipy's ``root`` (:class:`~optsolve.ScipyRoot`), given the RootSystem;
- "bracket": the JAX-native bracketing methods (:class:`~optsolve.Bisection`,
  :class:`~optsolve.Brentq`) on a scalar x, given the RootSystem with the problem's
  ``bracket``; SUCCESS by their own bracket test (or F = 0, or ``max|F| <= ftol`` where
  ``ftol`` is given), not by ``ftol``; a bracket without a sign change of F is a
  ValueError (FAILURE under a trace).

Whatever else ran, the Solution is SUCCESS only where ``max|F(x)| <= ftol``: a least-squares
method that converges to a minimum of ``|F|^2`` that is not a root ends STALLED.

Derivatives: at a root, ``F(x*(p), p) = 0`` gives ``J dx = -(dF/dp) dp`` with ``J = dF/dx``,
solved with J dense (the root finders hold it anyway) by least squares, so that where J is
singular the derivative is the minimum-norm one (with a RuntimeWarning), in forward and
reverse mode alike (reverse mode solves ``J^T u = c`` the same way). This is
:class:`~optsolve.ImplicitAdjoint`'s rule for the condition F = 0 instead of grad f = 0;
its matrix-free solvers assume a symmetric H, which a Jacobian is not, hence its own rule
here. :class:`~optsolve.UnrolledAdjoint` differentiates the iterations instead, for the
algorithms that can be unrolled.
"""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap
from jax.flatten_util import ravel_pytree

from optsolve.solve_api import host
from optsolve.solve_api.adjoint import (
    ImplicitAdjoint,
    UnrolledAdjoint,
    _closes_over_tracers,
    _instantiated,
    _perturbed,
    warn_each,
    with_tangent_rule,
)
from optsolve.solve_api.capabilities import (
    check_capabilities,
    check_solves_roots,
    resume_point,
)
from optsolve.solve_api.options import as_callback, make_options
from optsolve.solve_api.pytree import is_traced, replace
from optsolve.solve_api.registry import as_algorithm, backend_for
from optsolve.solve_api.returncode import BRACKET_SIGN, ReturnCode
from optsolve.solve_api.root_problem import (
    MATRIX_FREE_ABOVE,
    RootField,
    RootProblem,
    check_bracketed,
    check_root_function,
    derived,
    krylov_solve,
    residual_problem,
    root_system,
)
from optsolve.solve_api.solution import Solution
from optsolve.solve_api.solve_signature import solve_keyword_defaults

PyTree = Any

# The root tolerance on max|F| where solve is given no ftol: the classical methods' gtol
# defaults (descent.DEFAULT_GTOL, which the root finders' driver tests), by itemsize.
_DEFAULT_TOL = {8: 1e-8, 4: 1e-5, 2: 1e-2}

# solve's keywords a root solve takes; any other must be left at its default
_TAKEN = frozenset(
    {
        "maxiters",
        "maxtime",
        "ftol",
        "callback",
        "adjoint",
        "resume",
        "history",
        "metrics",
        "evaluate",
        "eval_every",
        "keep",
        "nonfinite",
    }
)
_WHY_NOT = {
    "gtol": "a root solve stops when max|F(x)| <= ftol (F is not a gradient); pass ftol",
    "progress": "the progress bar is not wired to root solves yet; use a callback",
    "data": "F(x, p) has no data argument; put data in p",
}


def default_tol(x0: PyTree) -> float:
    """The default ``ftol`` of a root solve: 1e-8 (float64), 1e-5 (float32), 1e-2 (16-bit
    floats), by x0's widest floating-point dtype."""
    size = max(jnp.dtype(jnp.result_type(leaf)).itemsize for leaf in jax.tree_util.tree_leaves(x0))
    return _DEFAULT_TOL[size]


def _check_keywords(keywords: dict[str, Any]) -> None:
    defaults = solve_keyword_defaults()
    for name, value in keywords.items():
        if name in _TAKEN:
            continue
        default = defaults.get(name, inspect.Parameter.empty)
        if value is default or (type(value) is type(default) and value == default):
            continue
        why = _WHY_NOT.get(name, "it does not apply to root finding")
        raise ValueError(
            f"solve: `{name}` is not an option of a RootProblem's solve: {why}. "
            "A root solve takes maxiters, maxtime, ftol, callback, history, "
            "metrics, evaluate, keep, resume, adjoint and the algorithm's own "
            "options."
        )
    if keywords.get("nonfinite") not in (None, "fail"):
        raise ValueError(
            "solve: a root solve ends with FAILURE at the last finite iterate "
            "where F is not finite (nonfinite='fail', the default); got "
            f"nonfinite={keywords['nonfinite']!r}."
        )


def solve_root(
    problem: RootProblem, algorithm: Any, options: dict[str, Any] | None = None, **keywords: Any
) -> Solution:
    """``solve(problem, algorithm, **keywords, **options)`` for a :class:`RootProblem` (see
    :func:`optsolve.solve` and this module's docstring).

    Options: ``ftol``, SUCCESS once ``max|F(x)| <= ftol`` (absolute; default 1e-8 in
    float64, 1e-5 in float32); ``maxiters``, ``maxtime``, ``callback`` (its objective is
    the merit ``0.5 |F|^2``, a fourth argument gets ``max|F|`` from the JAX-native root
    finders), ``history`` (``grad_norm`` records ``max|F|`` there), ``metrics``,
    ``evaluate``, ``keep``, ``resume``, ``adjoint`` and the algorithm's own options.
    """
    options = dict(options or {})
    _check_keywords(keywords)
    algorithm = as_algorithm(algorithm)
    form = check_solves_roots(algorithm)
    check_root_function(problem)
    if form == "bracket":
        check_bracketed(problem, type(algorithm).__name__)
    ftol = keywords.get("ftol")
    tol = default_tol(problem.x0) if ftol is None else ftol
    adjoint = keywords.get("adjoint")
    if adjoint is not None and not isinstance(adjoint, (ImplicitAdjoint, UnrolledAdjoint)):
        raise TypeError(
            f"solve: `adjoint` must be optsolve.ImplicitAdjoint() (the default) "
            f"or optsolve.UnrolledAdjoint(), got {adjoint!r}."
        )
    resume = keywords.get("resume")
    opts = make_options(
        algorithm,
        maxiters=keywords.get("maxiters"),
        maxtime=keywords.get("maxtime"),
        ftol=ftol,
        callback=as_callback(keywords.get("callback")),
        resume=resume_point(problem, resume),
        history=bool(keywords.get("history")),
        metrics=keywords.get("metrics"),
        evaluate=keywords.get("evaluate"),
        eval_every=keywords.get("eval_every", 1),
        keep=keywords.get("keep", "last"),
        **options,
    )
    if form in ("field", "scipy", "bracket"):
        # the driver's gradient test on F is the root test (ScipyRoot: scipy's fatol); the
        # driver's ftol / xtol tests are off
        opts = replace(opts, gtol=tol if form == "scipy" else ftol, ftol=None, xtol=None)
    elif form == "residuals":
        opts = replace(opts, ftol=None)  # ftol is the root's, not the relative reduction's
    if opts.history == -1:
        raise ValueError(
            "solve: `history=True` needs `maxiters` as a Python int (the "
            f"record's length), got maxiters={keywords.get('maxiters')!r}."
        )
    check_capabilities(_form_of(form, problem), algorithm, opts, adjoint=adjoint)
    backend = backend_for(algorithm)

    def run(problem: RootProblem, algorithm: Any, options: Any, **loop: Any) -> Solution:
        solution = backend(_form_of(form, problem), algorithm, options, **loop)
        if form == "bracket":
            return _sign_checked(solution, problem)
        return _judged(solution, problem, tol)

    traced = is_traced(problem, algorithm, opts) or host.under_a_trace()
    if traced:
        return _differentiated(adjoint, run, problem, algorithm, opts)
    start = time.perf_counter()
    with host.HostCalls() as calls:
        solution = _differentiated(adjoint, run, problem, algorithm, opts)
        jax.block_until_ready((solution.objective, solution.retcode))
    elapsed = time.perf_counter() - start
    if np.ndim(solution.retcode) != 0:  # a batch (a vmapped problem solved eagerly)
        return replace(solution, stats=replace(solution.stats, time=elapsed))
    if form == "bracket" and solution.reason is not None and int(solution.reason) == BRACKET_SIGN:
        raise _sign_error(problem)
    return _described(_eager(solution, elapsed, calls.interrupted), problem, algorithm, tol, form)


def _form_of(form: str, problem: RootProblem) -> Any:
    return residual_problem(problem) if form == "residuals" else root_system(problem)


def _max_residual(problem: RootProblem, x: PyTree) -> jax.Array:
    """``max|F(x, p)|`` (NaN where F is not finite)."""
    F = ravel_pytree(RootField(problem.F)(x, problem.p))[0]
    return jnp.max(jnp.abs(F))


_max_residual_compiled = jax.jit(_max_residual)


def _judged(solution: Solution, problem: RootProblem, tol: Any) -> Solution:
    """The solution with SUCCESS only where ``max|F(x)| <= tol``: a method that converged
    by its own tests elsewhere (a minimum of |F|^2 that is not a root) is STALLED."""
    residual = _max_residual(problem, solution.x)
    not_root = (solution.retcode == int(ReturnCode.SUCCESS)) & ~(residual <= tol)
    retcode = jnp.where(not_root, int(ReturnCode.STALLED), solution.retcode).astype(jnp.int32)
    reason = solution.reason
    if reason is not None:  # 0: no test of the backend's stopped it (the message says why)
        reason = jnp.where(not_root, 0, reason).astype(jnp.result_type(reason))
    return replace(solution, retcode=retcode, reason=reason)


def _bracket_values(problem: RootProblem) -> tuple[jax.Array, jax.Array]:
    """F at the ends of the problem's bracket."""
    field = RootField(problem.F)
    unflatten = jax.tree_util.tree_structure(problem.x0).unflatten
    a, b = problem.bracket
    values = [jax.tree_util.tree_leaves(field(unflatten([end]), problem.p))[0] for end in (a, b)]
    return values[0], values[1]


def _same_sign(problem: RootProblem) -> jax.Array:
    """F(a) and F(b) are finite and nonzero, with one sign."""
    fa, fb = _bracket_values(problem)
    finite = jnp.isfinite(fa) & jnp.isfinite(fb)
    return finite & (fa != 0) & (fb != 0) & (jnp.signbit(fa) == jnp.signbit(fb))


_same_sign_compiled = jax.jit(_same_sign)


def _sign_checked(solution: Solution, problem: RootProblem) -> Solution:
    """A bracketing run's solution with the reason :data:`BRACKET_SIGN` where F(a) and
    F(b) are nonzero with one sign (the method failed at its first step, at x0)."""
    same = _same_sign_compiled(problem)
    retcode = jnp.where(same, int(ReturnCode.FAILURE), solution.retcode).astype(jnp.int32)
    reason = solution.reason
    if reason is not None:
        reason = jnp.where(same, BRACKET_SIGN, reason).astype(jnp.result_type(reason))
    return replace(solution, retcode=retcode, reason=reason)


def _sign_error(problem: RootProblem) -> ValueError:
    fa, fb = (float(v) for v in _bracket_values(problem))
    a, b = (float(e) for e in problem.bracket)
    return ValueError(
        f"RootProblem: `bracket` = ({a:.6g}, {b:.6g}) holds no sign change of F: f(a) and "
        f"f(b) must have different signs, got F(a) = {fa:.6g}, F(b) = {fb:.6g}. Give a "
        "bracket whose ends F takes with opposite signs."
    )


def _eager(solution: Solution, elapsed: float, interrupted: bool) -> Solution:
    """An eager result in one set of types: a ReturnCode, Python ints (as ``solve``'s)."""

    def count(value):
        return None if value is None else int(value)

    stats = solution.stats
    code, reason, iterations, f_evals, grad_evals = jax.device_get(
        (solution.retcode, solution.reason, stats.iterations, stats.f_evals, stats.grad_evals)
    )
    retcode = ReturnCode(int(code))
    if interrupted and retcode in (ReturnCode.TERMINATED, ReturnCode.MAXTIME):
        retcode, reason = ReturnCode.INTERRUPTED, None
    return replace(
        solution,
        retcode=retcode,
        reason=count(reason),
        stats=replace(
            stats,
            iterations=count(iterations),
            f_evals=count(f_evals),
            grad_evals=count(grad_evals),
            time=elapsed,
        ),
    )


def _described(
    solution: Solution, problem: RootProblem, algorithm: Any, tol: Any, form: str
) -> Solution:
    """An eager solution whose message says how far from a root it ended."""
    residual = float(_max_residual_compiled(problem, solution.x))
    if form == "bracket":
        if solution.retcode == ReturnCode.SUCCESS:  # by the method's own bracket test
            if solution.reason == 12 and residual:  # the driver's words: a trust region's
                return replace(
                    solution,
                    reason=None,
                    detail=(
                        f"the bracket around the root is below xtol + rtol |x|; |F(x)| = "
                        f"{residual:.3g}"
                    ),
                )
            if solution.reason == 12:
                return replace(solution, reason=None, detail="F(x) = 0")
            # solve's ftol, the driver's gradient test on F: its words are a minimiser's
            return replace(
                solution, reason=None, detail=f"|F(x)| = {residual:.3g} <= ftol = {float(tol):.3g}"
            )
        return replace(solution, detail=f"|F(x)| = {residual:.3g}")
    if solution.retcode == ReturnCode.SUCCESS:
        # the driver's gradient test is the root test here: its wording is a minimiser's
        reason = None if form == "field" else solution.reason
        return replace(
            solution, reason=reason, detail=f"max|F(x)| = {residual:.3g} <= ftol = {float(tol):.3g}"
        )
    detail = f"max|F(x)| = {residual:.3g} > ftol = {float(tol):.3g}"
    if form == "scipy" and solution.detail:  # scipy's own words on why it stopped
        detail += f"; scipy: {solution.detail}"
    if solution.retcode == ReturnCode.STALLED and not solution.reason:
        detail += (
            f": {type(algorithm).__name__} converged by its own tests to a point that "
            "is not a root (a local minimum of |F|^2, or ftol below what the dtype "
            "resolves)"
        )
    return replace(solution, detail=detail)


# ------------------------------------------------------------------------------ derivatives

ROOT_SINGULAR_MESSAGE = (
    "optsolve: the Jacobian dF/dx at the root is singular; the implicit derivative is the "
    "minimum-norm least-squares solution of J dx = -(dF/dp) dp, which gives the null "
    "directions no derivative."
)


def _warn(flag: Any) -> None:
    if bool(flag):
        warnings.warn(ROOT_SINGULAR_MESSAGE, RuntimeWarning, stacklevel=2)


@custom_vmap
def _warn_singular(flag: jax.Array) -> jax.Array:
    """Warn at run time when ``flag`` is true; a batch (``jax.jacrev``'s rows) warns once."""
    jax.debug.callback(_warn, flag)
    return flag


@_warn_singular.def_vmap
def _warn_singular_batched(axis_size, in_batched, flag):
    del axis_size, in_batched
    return _warn_singular(jnp.any(flag)), False


def _least_squares(matrix: jax.Array, b: jax.Array) -> jax.Array:
    v, _, rank, _ = jnp.linalg.lstsq(matrix, b)
    _warn_singular(rank < b.size)
    return v


def _krylov(matvec: Any, b: jax.Array) -> jax.Array:
    """J v = b matrix-free (:func:`krylov_solve`'s "auto") to eps^0.6 relative (about
    4e-10 in float64, 7e-5 in float32), at most 10 n products; a singular J gets what the
    Krylov method reaches, without the dense path's minimum-norm guarantee."""
    tol = float(jnp.finfo(b.dtype).eps) ** 0.6
    return krylov_solve("auto", matvec, b, tol, 10 * b.size)


def _tangents(
    problem: RootProblem, x: PyTree, p_dot: PyTree | None, p_dot_or_zero: PyTree
) -> tuple[PyTree, jax.Array]:
    """dx and d(0.5 |F|^2) at the root ``x`` for the tangent ``p_dot`` of p."""
    field = RootField(problem.F)
    flat_x, unravel = ravel_pytree(x)
    if p_dot is None:
        dx = jax.tree_util.tree_map(jnp.zeros_like, x)
    else:

        def flat_F(z):
            return ravel_pytree(field(unravel(z), problem.p))[0]

        _, rhs = jax.jvp(lambda q: ravel_pytree(field(x, q))[0], (problem.p,), (p_dot,))
        rhs = -rhs.astype(flat_x.dtype)
        if flat_x.size > MATRIX_FREE_ABOVE:
            _, jvp = jax.linearize(flat_F, flat_x)
            dx = unravel(lax.custom_linear_solve(jvp, rhs, solve=_krylov, transpose_solve=_krylov))
        else:
            jac = jax.jacfwd(flat_F)(flat_x)
            dx = unravel(
                lax.custom_linear_solve(
                    lambda v: jac @ v,
                    rhs,
                    solve=lambda _, b: _least_squares(jac, b),
                    transpose_solve=lambda _, b: _least_squares(jac.T, b),
                )
            )

    def merit(x, p):
        F = ravel_pytree(field(x, p))[0]
        return 0.5 * jnp.sum(jnp.square(F))

    _, dobjective = jax.jvp(merit, (x, problem.p), (dx, p_dot_or_zero))
    return dx, dobjective


_compiled_tangents = jax.jit(_tangents)


def _warn_not_a_root(code) -> None:
    code = ReturnCode(int(code))
    if code != ReturnCode.SUCCESS:
        warnings.warn(
            f"optsolve: differentiating a root solve whose retcode is {code.name}; the "
            "implicit derivative assumes F(x, p) = 0 and may be inaccurate. Raise maxiters "
            "or check the problem has a root near x0.",
            RuntimeWarning,
            stacklevel=2,
        )


def _hoisted(problem: RootProblem) -> RootProblem:
    """The problem with values that F closes over and that an enclosing transformation
    traces moved into p (``jax.closure_convert``), so that the implicit rule sees them."""
    if not _closes_over_tracers(problem.F):
        return problem
    converted, consts = jax.closure_convert(problem.F, problem.x0, problem.p)
    return derived(problem, F=lambda x, pc: converted(x, pc[0], *pc[1]), p=(problem.p, consts))


def _differentiated(
    adjoint: Any, run: Any, problem: RootProblem, algorithm: Any, options: Any
) -> Solution:
    """The run, differentiable with respect to p: by the implicit function theorem
    (default), or through the iterations (UnrolledAdjoint)."""
    if isinstance(adjoint, UnrolledAdjoint):
        return adjoint.apply(run, problem, algorithm, options)
    problem = _hoisted(problem)
    if not is_traced(problem, algorithm):
        return run(problem, algorithm, options)

    def tangents(problem, algorithm, problem_dot, algorithm_dot, solution):
        if _perturbed(algorithm_dot):
            raise ValueError(
                "solve: a root is being differentiated with respect to the algorithm's own "
                f"hyperparameters ({type(algorithm).__name__}); at a root x* does not depend "
                "on them. Differentiate with respect to the problem's p."
            )
        warn_each(_warn_not_a_root, solution.retcode)
        p_dot = _instantiated(problem_dot.p, problem.p)
        p_dot_or_zero = (
            p_dot if p_dot is not None else _instantiated(problem_dot.p, problem.p, always=True)
        )
        return _compiled_tangents(problem, solution.x, p_dot, p_dot_or_zero)

    # a second derivative differentiates the rule again, not the iterations
    return with_tangent_rule(run, problem, algorithm, options, tangents, rule_differentiable=True)
