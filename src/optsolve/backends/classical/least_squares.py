"""Least-squares methods on residuals and their Jacobian: Gauss-Newton with a line search
and Moré's Levenberg-Marquardt, each dense (an SVD of the Jacobian) for small problems or
matrix-free (conjugate gradients on Jacobian products) for large ones.

They solve a :class:`~optsolve.solve_api.least_squares.LeastSquaresProblem`; ``f`` is
``0.5 |r|^2`` and the gradient the driver tests is ``J^T r``. The Jacobian comes from
``jax.jacfwd`` (residuals >= parameters) or ``jax.jacrev``; the matrix-free paths use only
``jax.linearize`` (``J v``) and its transpose (``J^T u``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from optsolve.backends.classical.descent import (
    ClassicalAlgorithm,
    DescentSolver,
    _default_linesearch,
    check_positive,
    default_gtol,
    register,
)
from optsolve.backends.classical.linesearch import Backtracking
from optsolve.backends.classical.second_order import steihaug_cg
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.least_squares import LeastSquaresProblem, jacobian_of, residual_size
from optsolve.solve_api.linear_solve import cg
from optsolve.solve_api.loops import inner_while_loop
from optsolve.solve_api.pytree import pytree_dataclass, static_field

Array = jax.Array

# The dense path materialises the m x n Jacobian (n forward passes) and factorises it;
# "auto" goes matrix-free beyond this many entries or parameters.
DENSE_ENTRIES = 2**24
DENSE_PARAMETERS = 256
_LINEAR_SOLVERS = ("auto", "dense", "cg")
# MINPACK's defaults (and scipy.optimize.least_squares'): relative tests at 1e-8.
DEFAULT_TOL = 1e-8


class Residuals:
    """A least-squares problem seen through flat vectors: residuals, Jacobian, products."""

    def __init__(self, problem: LeastSquaresProblem, p: Any):
        _, self.unravel = ravel_pytree(problem.x0)
        self.problem, self.p = problem, p

    def __call__(self, x: Array) -> Array:
        return ravel_pytree(self.problem.residual(self.unravel(x), self.p))[0]

    def jacobian(self, x: Array, m: int) -> Array:
        """The dense m x n Jacobian: forward mode when m >= n, else reverse mode."""
        return jacobian_of(self, m, x.size)(x)

    def linearized(self, x: Array) -> tuple[Array, Any, Any]:
        """(r(x), v -> J v, u -> J^T u), linearised once at x."""
        r, jvp = jax.linearize(self, x)
        vjp = jax.linear_transpose(jvp, x)
        return r, jvp, lambda u: vjp(u)[0]


def _check_linear_solver(owner: str, value: str) -> None:
    if value not in _LINEAR_SOLVERS:
        raise ValueError(
            f"{owner}: `linear_solver` must be one of "
            f"{', '.join(map(repr, _LINEAR_SOLVERS))}, got {value!r}."
        )


def _uses_dense(alg: Any, m: int, n: int) -> bool:
    if alg.linear_solver == "auto":
        return m * n <= DENSE_ENTRIES and n <= DENSE_PARAMETERS
    return alg.linear_solver == "dense"


class DenseWhenAsked:
    """The ``capabilities`` of a class whose ``linear_solver`` picks dense matrices or
    products: with ``"dense"`` the Jacobian and its factorisation are dense at any size
    (``dense_matrices``: about three of the Jacobian's size); otherwise they are dense only
    below the class's own size threshold, or not at all."""

    def capabilities(self) -> dict[str, Any]:
        """The class's traits, ``dense_matrices`` as ``linear_solver`` says."""
        caps = super().capabilities()  # type: ignore[misc]
        caps["dense_matrices"] = 3 if self.linear_solver == "dense" else 0  # type: ignore
        return caps


def _check_problem(owner: str, problem: Any) -> None:
    if not isinstance(problem, LeastSquaresProblem):  # solve checks first; a direct caller
        raise TypeError(
            f"{owner} needs an optsolve.LeastSquaresProblem, got {type(problem).__name__}."
        )


def default_tol(dtype: Any, m: int) -> float:
    """The default ftol and xtol: MINPACK's 1e-8, or, where the dtype cannot resolve it, a
    few rounding errors of the sum of m squares (``4 eps sqrt(m)``: float32 with 14
    residuals, 1.8e-6). Below that, the relative reductions and steps the tests compare
    are rounding noise, and a converged low-precision fit would end STALLED."""
    return max(DEFAULT_TOL, 4.0 * float(jnp.finfo(dtype).eps) * math.sqrt(m))


def _tolerances(options: Any, default: float) -> tuple[Any, Any]:
    ftol = options.ftol if options.ftol is not None else default
    xtol = options.get("xtol")
    return ftol, default if xtol is None else xtol


# --------------------------------------------------------------------------- Gauss-Newton


class _GaussNewtonSolver(DescentSolver):
    tests_tolerances: ClassVar[bool] = True

    def __init__(self, alg: GaussNewton, problem: LeastSquaresProblem):
        _check_problem("GaussNewton", problem)
        super().__init__(alg, problem)
        self.m = residual_size(problem)
        self.dense = _uses_dense(alg, self.m, self.n)
        self.ftol = self.xtol = default_tol(self.dtype, self.m)

    def bind_options(self, options):
        self.ftol, self.xtol = _tolerances(options, default_tol(self.dtype, self.m))

    def direction(self, model, x, g, state, flat):
        residuals = Residuals(self.problem, flat.objective.p)
        if self.dense:
            # the least-norm solution of J d = -r (an SVD: rank-deficient J is fine)
            d = -jnp.linalg.lstsq(residuals.jacobian(x, self.m), residuals(x))[0]
        else:
            _, jvp, vjp = residuals.linearized(x)
            maxiter = self.alg.cg_maxiter if self.alg.cg_maxiter is not None else 2 * self.n
            d = cg(lambda v: vjp(jvp(v)), -g, rtol=self.alg.cg_rtol, maxiter=maxiter).x
        return d.astype(self.dtype), jnp.zeros((), bool)

    def step(self, objective: Objective, x, f, g, state) -> Step:
        step = super().step(objective, x, f, g, state)
        xf, xn = ravel_pytree(x)[0], ravel_pytree(step.x)[0]
        # scipy's tests, |df| < ftol f and |dx| < xtol (xtol + |x|), on a full Gauss-Newton
        # step only: a step the line search cut short (at the edge of a non-finite region,
        # say) says nothing about convergence
        full = jnp.any(xn != xf) & (step.state.alpha == 1) & ~step.nonfinite_trials
        reduced = full & (jnp.abs(f - step.f) <= self.ftol * f)
        small = full & (jnp.linalg.norm(xn - xf) <= self.xtol * (self.xtol + jnp.linalg.norm(xn)))
        return step._replace(reduction_converged=reduced, radius_converged=small)


@register
@pytree_dataclass
class GaussNewton(DenseWhenAsked, ClassicalAlgorithm):
    """Gauss-Newton with a backtracking line search, for least-squares problems.

    Each iteration solves the linearised problem ``min_d |J d + r|`` (the least-norm
    solution, by an SVD of J, or matrix-free by conjugate gradients on ``J^T J d = -J^T r``)
    and backtracks along d from the unit step until the Armijo condition holds (Nocedal &
    Wright, *Numerical Optimization*, 2006, §10.3). It stops when the gradient ``J^T r``
    meets gtol, when ``|f_k - f_{k+1}| <= ftol f_k`` or when
    ``|x_k - x_{k+1}| <= xtol (xtol + |x_{k+1}|)`` (scipy's tests; ftol and xtol are
    ``solve`` options, default 1e-8, or ``4 eps sqrt(m)`` for m residuals where the dtype's
    eps makes that larger: float32).

    When to prefer :class:`LevenbergMarquardt`: Gauss-Newton drops the residuals' second
    derivatives, which is sound only where the residuals at the solution are small or
    nearly linear. With large residuals at the minimum (scipy's ``fun_trivial``,
    ``r = x^2 + 5``: the step ``-r / J`` aims at a root that does not exist) it converges
    slowly or not at all and ends at maxiters, and from a poor start on a badly scaled
    problem (scipy's scaled Meyer problem) the unit step can leave the region where the
    linear model holds. LevenbergMarquardt's trust region and scaling are the safeguard:
    prefer LevenbergMarquardt unless the residuals are known to be small at the solution
    (curve_fit's default is LevenbergMarquardt).

    Args:
      linear_solver: "auto" (default: dense for at most 256 parameters and 2^24 Jacobian
        entries, else matrix-free), "dense" or "cg" (static).
      cg_rtol: the relative residual at which CG stops (matrix-free; default 1e-6).
      cg_maxiter: the most CG iterations per step (static; default 2n).
      linesearch: :class:`Backtracking` (default) or :class:`Zoom`.

    Example:
      >>> sol = optsolve.solve(optsolve.LeastSquaresProblem(r, x0, p), optsolve.GaussNewton())
    """

    needs_residuals: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 1000

    linear_solver: str = static_field(default="auto")
    cg_rtol: Any = 1e-6
    cg_maxiter: int | None = static_field(default=None)
    linesearch: Any = None

    def __post_init__(self):
        _check_linear_solver("GaussNewton", self.linear_solver)
        check_positive("GaussNewton", "cg_rtol", self.cg_rtol)
        _default_linesearch(self, Backtracking())

    def make_solver(self, problem: LeastSquaresProblem) -> _GaussNewtonSolver:
        return _GaussNewtonSolver(self, problem)


# ------------------------------------------------------------------ Levenberg-Marquardt


def _sqrt(v: Array) -> Array:
    """sqrt with a zero derivative at 0 (not inf): reverse mode through an unrolled run
    meets lambda = 0 and zero steps, where inf times 0 is NaN. NaN stays NaN: a trial's
    non-finite residual norm must read as non-finite (the trial is then rejected)."""
    positive = v > 0
    return jnp.where(
        positive,
        jnp.sqrt(jnp.where(positive, v, 1.0)),
        jnp.where(v == 0, 0.0, jnp.nan).astype(jnp.result_type(v)),
    )


def _norm(v: Array, axis: int | None = None) -> Array:
    """The 2-norm, with :func:`_sqrt`'s derivative at 0."""
    return _sqrt(jnp.sum(jnp.square(v), axis=axis))


class _LMState(NamedTuple):
    # [R | Q^T r] of the Jacobian's QR factorisation J = Q R at x (dense path; no rows
    # matrix-free): all the step needs, n x (n + 1), not m x n; one array, so that carrying
    # and selecting it is one kernel, not two
    factor: Array
    # (D, delta, par, first, nonfinite) as one vector (flags as 0 / 1), for the same reason:
    # Moré's scaling D; the trust radius in the D-norm; the Levenberg-Marquardt parameter;
    # no step taken yet (delta is then set from |D x0|); some trial met non-finite
    # residuals (a stall then says so)
    scalars: Array

    @staticmethod
    def of(factor, diag, delta, par, first, nonfinite) -> _LMState:
        dtype = diag.dtype
        return _LMState(
            factor,
            jnp.concatenate(
                [
                    diag,
                    jnp.stack(
                        [jnp.asarray(v).astype(dtype) for v in (delta, par, first, nonfinite)]
                    ),
                ]
            ),
        )

    def after(self, factor, diag, delta, par, accepted, nonfinite) -> _LMState:
        """The state after a step: the flags updated from the old array entry by entry (read
        elsewhere, XLA would write the new array apart from the old and copy it)."""
        fresh = _LMState.of(factor, diag, delta, par, False, False).scalars
        old, index = self.scalars, np.arange(self.scalars.size)
        flags = jnp.where(
            index == index.size - 2,
            jnp.where(accepted, jnp.zeros_like(old), old),
            jnp.where(nonfinite, jnp.ones_like(old), old),
        )
        return _LMState(factor, jnp.where(index >= index.size - 2, flags, fresh))

    @property
    def diag(self) -> Array:
        return self.scalars[:-4]

    @property
    def delta(self) -> Array:
        return self.scalars[-4]

    @property
    def par(self) -> Array:
        return self.scalars[-3]

    @property
    def first(self) -> Array:
        return self.scalars[-2] > 0

    @property
    def nonfinite(self) -> Array:
        return self.scalars[-1] > 0

    @property
    def rfac(self) -> Array:
        return self.factor[:, :-1]

    @property
    def qtr(self) -> Array:
        return self.factor[:, -1]


def _factorised(jac: Array, r: Array) -> Array:
    """``[R | Q^T r]`` of ``jac = Q R``, from one QR factorisation of ``[jac | r]`` (Q is
    never formed: the last column of that R is ``Q^T r``); R is min(m, n) x n."""
    k = min(jac.shape[0], jac.shape[1])
    aug = jnp.linalg.qr(jnp.concatenate([jac, r[:, None].astype(jac.dtype)], axis=1), mode="r")
    return aug[:k]


class _Spectrum(NamedTuple):
    """What every trial of a step needs from the scaled Jacobian's SVD ``U diag(s) V^T``:
    ``a = s * U^T r``, the Gauss-Newton step's coefficients ``a / s^2`` (0 where s = 0),
    ``|a|``, their norm and ``sum q_i^2 / s_i^2``, and whether J has full rank."""

    s: Array
    a: Array
    gn_coef: Array
    a_norm: Array
    gn_norm: Array
    gn_q: Array
    full_rank: Array


def _spectrum(s: Array, a: Array, *rows: Array) -> tuple[_Spectrum, Array]:
    """The :class:`_Spectrum` of ``s`` and ``a``, and the sums of ``rows`` (vectors of s's
    length) with their square roots: every sum from one reduction of a stacked array (one
    kernel, not one each)."""
    s2 = jnp.square(s)
    safe = s2 > 0
    q = jnp.where(safe, a / jnp.where(safe, s2, 1.0), 0.0)
    terms = [
        jnp.square(a),
        jnp.square(q),
        jnp.where(safe, jnp.square(q) / jnp.where(safe, s2, 1.0), 0.0),
        (~(s > 0)).astype(s.dtype),
        *rows,
    ]
    sums = jnp.sum(jnp.stack(terms), axis=1)
    roots = _sqrt(sums)  # one kernel for the square roots, not one each
    return (_Spectrum(s, a, q, roots[0], roots[1], sums[2], sums[3] == 0), (sums[4:], roots[4:]))


def _step_coefficients(spectrum, delta_par) -> Array:
    """``[c, lambda]``: the Levenberg-Marquardt parameter lambda for the radius delta and
    the step's coefficients ``c = a / (s^2 + lambda)`` (0 where that is 0; the step in the
    scaled space is ``-V c``), with ``(delta, par) = delta_par()`` (par: the last lambda).
    lambda = 0 if the Gauss-Newton step is within 1.1 delta, else the lambda > 0 with
    ``|c| = delta`` to 10% (Moré 1978, §5; MINPACK's lmpar), by safeguarded Newton steps on
    ``1/|c| - 1/delta`` (at most 10), where ``|c(lambda)|^2 = sum (a_i / (s_i^2 +
    lambda))^2``. One array, so that a conditional writes it as one kernel. ``spectrum()``
    gives the :class:`_Spectrum`, ``delta_par()`` (delta, par): both are read inside the
    conditional's branches (scalars passed to it as operands are a kernel each)."""
    sp = spectrum()
    s2 = jnp.square(sp.s)
    tiny = jnp.finfo(sp.s.dtype).tiny
    a = sp.a

    def coefficients(lam):
        d = s2 + lam
        safe = d > 0
        return jnp.where(safe, a / jnp.where(safe, d, 1.0), 0.0), safe, d

    def norms(lam):
        q, safe, d = coefficients(lam)
        return _norm(q), jnp.sum(jnp.where(safe, jnp.square(q) / jnp.where(safe, d, 1.0), 0.0))

    def solve():
        delta, par = delta_par()
        sp = spectrum()
        gn_norm, gn_q = sp.gn_norm, sp.gn_q
        fp0 = gn_norm - delta
        # the Newton step from 0 bounds lambda below when J has full rank (Moré 1978, §5)
        lower = jnp.where(
            sp.full_rank, fp0 / delta * jnp.square(gn_norm) / jnp.maximum(gn_q, tiny), 0.0
        )
        lower = jnp.maximum(lower, 0.0)
        upper = sp.a_norm / delta
        upper = jnp.where(upper == 0, tiny / jnp.minimum(delta, 0.1), upper)
        lam = jnp.clip(par, lower, upper)
        lam = jnp.where(lam == 0, upper * 1e-3, lam)

        def body(c):
            lam, lower, upper, done, i = c
            bad = (lam <= lower) | (lam > upper)
            lam = jnp.where(bad & ~done, jnp.maximum(1e-3 * upper, jnp.sqrt(lower * upper)), lam)
            pn, q = norms(lam)
            fp = pn - delta
            done = done | (jnp.abs(fp) <= 0.1 * delta)
            lower = jnp.where(fp > 0, jnp.maximum(lower, lam), lower)
            upper = jnp.where(fp < 0, jnp.minimum(upper, lam), upper)
            newton = lam + fp / delta * jnp.square(pn) / jnp.maximum(q, tiny)
            return jnp.where(done, lam, jnp.maximum(lower, newton)), lower, upper, done, i + 1

        # a loop that ends once lambda is found: a fixed count of 10 would run every kernel
        # of the body 10 times a trial; bounded (10, static), so that UnrolledAdjoint's
        # reverse mode runs through it
        lam = inner_while_loop(
            lambda c: ~c[3] & (c[4] < 10),
            body,
            (lam, lower, upper, jnp.zeros((), bool), jnp.zeros((), jnp.int32)),
            10,
        )[0]
        return jnp.concatenate([coefficients(lam)[0], lam[None]])

    # lambda = 0 where the Gauss-Newton step fits: a conditional, so that such a trial runs
    # none of the search's set-up (its bounds and first guess are a dozen small kernels)
    gn = lambda: jnp.concatenate([sp.gn_coef, jnp.zeros((1,), sp.s.dtype)])
    return lax.cond(spectrum().gn_norm <= 1.1 * delta_par()[0], gn, solve)


class _Trial(NamedTuple):
    """The trial loop's carry: the last trial point and its residuals, and every scalar of
    the search packed in one array (``_TRIAL_SCALARS`` names them; flags as 0 / 1). Packed,
    the scalar bookkeeping of a trial is written by one kernel: as separate carried scalars,
    XLA's CPU backend gives each its own kernel, and each shared division or square root
    one more."""

    x: Array
    r: Array
    scalars: Array

    def get(self, name: str) -> Array:
        return self.scalars[_TRIAL_SCALARS.index(name)]

    def flag(self, name: str) -> Array:
        return self.get(name) > 0


_TRIAL_SCALARS = (
    "k",
    "delta",
    "par",
    "accepted",
    "reduction_converged",
    "radius_converged",
    "stalled",
    "nonfinite",
    "done",
    "sum_squares",
) + (
    # and the step's scalars that no trial changes (carried through unchanged): as operands
    # of the loop, each would be written by a kernel of its own before it
    "first",
    "fnorm",
    "xnorm",
    "a_norm",
    "gn_norm",
    "gn_q",
    "full_rank",
    "gn_prered",
)
_TRIAL_INVARIANTS = _TRIAL_SCALARS[10:]


def _pack(dtype: Any, **values: Array) -> Array:
    # elementwise selects rather than a stack: XLA writes a stack's (concatenate's) parts
    # in place, one kernel each, where a chain of selects is one loop fusion; the masks are
    # NumPy constants (computed by jnp, XLA hoists each out of the loops as a kernel)
    index = np.arange(len(_TRIAL_SCALARS))
    packed = jnp.zeros(len(_TRIAL_SCALARS), dtype)
    for i, name in enumerate(_TRIAL_SCALARS):
        if name in values:
            packed = jnp.where(index == i, jnp.asarray(values[name]).astype(dtype), packed)
    return packed


class _LevenbergMarquardtSolver(SteppingSolver):
    tests_tolerances: ClassVar[bool] = True

    def __init__(self, alg: LevenbergMarquardt, problem: LeastSquaresProblem):
        _check_problem("LevenbergMarquardt", problem)
        self.alg, self.problem = alg, problem
        x0 = ravel_pytree(problem.x0)[0]
        self.n, self.dtype = x0.size, x0.dtype
        self.m = residual_size(problem)
        self.dense = _uses_dense(alg, self.m, self.n)
        self.default_gtol = default_gtol(self.dtype)
        self.default_maxiters = type(alg).default_maxiters
        self.ftol = self.xtol = default_tol(self.dtype, self.m)

    def bind_options(self, options):
        self.ftol, self.xtol = _tolerances(options, default_tol(self.dtype, self.m))

    def init(self, objective: Objective, x, f, g) -> _LMState:
        residuals = Residuals(self.problem, objective.p)
        xf = ravel_pytree(x)[0]
        if self.dense:
            factor = _factorised(residuals.jacobian(xf, self.m), residuals(xf))
        else:
            factor = jnp.zeros((0, self.n + 1), self.dtype)
        zero = jnp.zeros((), self.dtype)
        return _LMState.of(
            factor, jnp.ones_like(xf), zero, zero, jnp.ones((), bool), jnp.zeros((), bool)
        )

    def step(self, objective: Objective, x, f, g, state: _LMState) -> Step:
        residuals = Residuals(self.problem, objective.p)
        xf = ravel_pytree(x)[0]
        gf = ravel_pytree(g)[0]
        fnorm = jnp.sqrt(2 * f)  # f = |r|^2 / 2
        zero_residual = fnorm == 0  # an exact fit: no step can reduce |r|
        fnorm = jnp.where(zero_residual, 1.0, fnorm)
        alg, eps = self.alg, jnp.finfo(self.dtype).eps
        if self.dense:
            # J's column norms are R's; J D^-1 = Q (R D^-1), so the SVD of the small
            # R D^-1 is the scaled Jacobian's, and U^T Q^T r its residual's coordinates
            colnorm = _norm(state.rfac, axis=0).astype(self.dtype)
            diag = jnp.where(
                state.first, jnp.where(colnorm == 0, 1.0, colnorm), jnp.maximum(state.diag, colnorm)
            )
            u, s, vt = jnp.linalg.svd(state.rfac / diag[None, :], full_matrices=False)
            # a rank-deficient J: singular values at rounding level are zero (the step
            # stays out of the null space; scipy's rule for its pseudo-inverse)
            s = jnp.where(s > eps * max(self.m, self.n) * s[0], s, 0.0)
            c = u.T @ state.qtr
            # with the relative reduction the Gauss-Newton step predicts (|r's part in
            # range(J)|^2) and |D x|, in the spectrum's one reduction
            rows = [jnp.square(jnp.where(s > 0, c, 0.0))]
            if s.size == xf.size:
                spectrum, (sums, roots) = _spectrum(s, s * c, *rows, jnp.square(diag * xf))
                xnorm = roots[1]
            else:
                spectrum, (sums, _) = _spectrum(s, s * c, *rows)
                xnorm = _norm(diag * xf)
            gn_prered = sums[0] / jnp.square(fnorm)
        else:  # matrix-free: the unscaled norm (column norms would cost n products)
            diag = state.diag
            _, jvp, vjp = residuals.linearized(xf)
            xnorm = _norm(diag * xf)
        delta0 = jnp.where(
            state.first, jnp.where(xnorm == 0, alg.factor, alg.factor * xnorm), state.delta
        )
        packed_dtype = jnp.result_type(delta0, state.par)
        invariants = dict(first=state.first, fnorm=fnorm, xnorm=xnorm)
        if self.dense:
            invariants.update(
                a_norm=spectrum.a_norm,
                gn_norm=spectrum.gn_norm,
                gn_q=spectrum.gn_q,
                full_rank=spectrum.full_rank,
                gn_prered=gn_prered,
            )
        # packed where the packed dtype holds them exactly
        packed_invariants = {
            name: v
            for name, v in invariants.items()
            if jnp.result_type(v) in (jnp.dtype(bool), packed_dtype)
        }

        def invariant(t: _Trial, name: str) -> Array:
            if name not in packed_invariants:
                return invariants[name]
            return t.flag(name) if invariants[name].dtype == bool else t.get(name)

        def trial_step(t: _Trial, fnorm: Array):
            """(trial point x + p, scaled norms |D p| and |D (x + p)|, par, the model's
            terms (dense: |J p| and sqrt(par) |D p|; matrix-free: the predicted relative
            reduction), whether p is the Gauss-Newton step, the reduction the Gauss-Newton
            step predicts)."""
            if self.dense:
                # delta and par are read inside the conditional's branches: passed as
                # operands, each would be a kernel of its own
                packed = _step_coefficients(
                    lambda: spectrum._replace(
                        **{
                            name: invariant(t, name)
                            for name in ("a_norm", "gn_norm", "gn_q", "full_rank")
                        }
                    ),
                    lambda: (t.get("delta"), t.get("par")),
                )
                coef, par = packed[:-1], packed[-1]
                x_trial = xf - (vt.T @ coef) / diag
                # V's columns are orthonormal: |J p| = |S V^T D p| = |S coef| and
                # |D p| = |coef|: with |D x_trial|, the reductions of one small stacked
                # array (one kernel) rather than a second product with V and three
                # reductions of their own
                rows = [s * coef, coef, diag * x_trial]
                if s.size == xf.size:
                    jp, pnorm, xnorm_trial = _norm(jnp.stack(rows), axis=1)
                else:
                    jp, pnorm, xnorm_trial = (_norm(v) for v in rows)
                # divided by |r| with the trial's |r| (body): one kernel for three divisions
                return (
                    x_trial,
                    pnorm,
                    xnorm_trial,
                    par,
                    jnp.stack([jp, _sqrt(par) * pnorm]),
                    par == 0,
                    invariant(t, "gn_prered"),
                )
            # Steihaug-CG on the Gauss-Newton model within |p| <= delta
            maxiter = alg.cg_maxiter if alg.cg_maxiter is not None else 2 * self.n
            delta, par = t.get("delta"), t.get("par")
            p, model, boundary = steihaug_cg(
                lambda v: vjp(jvp(v)), gf, delta, alg.cg_rtol * _norm(gf), maxiter
            )
            prered = -2 * model / jnp.square(fnorm)
            # inside the region, the step is the Gauss-Newton one (to CG's tolerance)
            gn = jnp.where(boundary, jnp.inf, prered)
            x_trial = xf + p
            return (
                x_trial,
                _norm(p),
                _norm(diag * x_trial),
                jnp.zeros_like(par),
                prered,
                ~boundary,
                gn,
            )

        def cond(t: _Trial):
            return ~t.flag("done")

        def body(t: _Trial) -> _Trial:
            t_delta = t.get("delta")
            fnorm, xnorm = invariant(t, "fnorm"), invariant(t, "xnorm")
            x_trial, pnorm, xnorm_trial, par, model, inside, gn_prered = trial_step(t, fnorm)
            delta = jnp.where(invariant(t, "first"), jnp.minimum(t_delta, pnorm), t_delta)
            r_trial = residuals(x_trial)
            # |r|^2 is kept for the accepted point's value: a sum of m squares is three
            # kernels on XLA's CPU backend (squares, partial sums, their sum)
            sum_squares = jnp.sum(jnp.square(r_trial))
            fnorm1 = _sqrt(sum_squares)
            finite = jnp.isfinite(fnorm1)
            if self.dense:  # model: |J p| and sqrt(par) |D p|, to divide by |r|
                temp1, temp2, fratio = jnp.concatenate([model, fnorm1[None]]) / fnorm
                prered = jnp.square(temp1) + 2 * jnp.square(temp2)
                dirder = -(jnp.square(temp1) + jnp.square(temp2))
            else:  # model: the predicted relative reduction
                prered, dirder, fratio = model, -model, fnorm1 / fnorm
            actred = jnp.where(finite & (0.1 * fnorm1 < fnorm), 1 - jnp.square(fratio), -1.0)
            # the ratio and Moré's radius update (MINPACK lmder): two divisions, one kernel
            denominator = dirder + 0.5 * actred
            quotients = jnp.stack([actred, 0.5 * dirder]) / jnp.stack(
                [jnp.where(prered != 0, prered, 1.0), jnp.where(denominator != 0, denominator, 1.0)]
            )
            ratio = jnp.where(prered != 0, quotients[0], 0.0)
            shrink = jnp.where(actred >= 0, 0.5, quotients[1])
            shrink = jnp.where(~finite | (0.1 * fnorm1 >= fnorm) | (shrink < 0.1), 0.1, shrink)
            low = ratio <= 0.25
            grow = ~low & ((par == 0) | (ratio >= 0.75))
            delta = jnp.where(
                low, shrink * jnp.minimum(delta, pnorm / 0.1), jnp.where(grow, pnorm / 0.5, delta)
            )
            par = jnp.where(low, par / shrink, jnp.where(grow, 0.5 * par, par))
            accepted = finite & (ratio >= 1e-4)
            xnorm_new = jnp.where(accepted, xnorm_trial, xnorm)
            # Moré's tests; but a region that stops the Gauss-Newton step (non-finite values
            # ahead, say) is small for another reason than convergence, so the reduction
            # the Gauss-Newton step predicts must be small too, and the step must be it
            reduced = (
                (jnp.abs(actred) <= self.ftol)
                & (prered <= self.ftol)
                & (0.5 * ratio <= 1)
                & (gn_prered <= self.ftol)
            )
            radius = inside & (delta <= self.xtol * xnorm_new)
            stalled = ((jnp.abs(actred) <= eps) & (prered <= eps) & (0.5 * ratio <= 1)) | (
                delta <= eps * xnorm_new
            )
            k = t.get("k") + 1
            return _Trial(
                x_trial,
                r_trial,
                _pack(
                    t.scalars.dtype,
                    k=k,
                    delta=delta,
                    par=par,
                    accepted=accepted,
                    reduction_converged=reduced,
                    radius_converged=radius,
                    stalled=stalled,
                    nonfinite=t.flag("nonfinite") | ~finite,
                    done=accepted | reduced | radius | stalled | (k >= alg.max_trials),
                    sum_squares=sum_squares,
                    **{name: t.get(name) for name in packed_invariants},
                ),
            )

        false = jnp.zeros((), bool)
        t = inner_while_loop(
            cond,
            body,
            _Trial(
                xf,
                jnp.zeros((self.m,), jnp.result_type(f)),
                _pack(
                    packed_dtype,
                    k=0,
                    delta=delta0,
                    par=state.par,
                    accepted=False,
                    reduction_converged=zero_residual,
                    radius_converged=False,
                    stalled=False,
                    nonfinite=False,
                    done=zero_residual,
                    sum_squares=0.0,
                    **packed_invariants,
                ),
            ),
            alg.max_trials,
        )
        accepted, trials = t.flag("accepted"), t.get("k").astype(jnp.int32)
        x_new = jnp.where(accepted, t.x, xf)
        f_new = jnp.where(accepted, (0.5 * t.get("sum_squares")).astype(f.dtype), f)
        if self.dense and jnp.result_type(f) == state.factor.dtype == self.dtype:
            # the new point's factorisation, x, J^T r and f as one array from the
            # conditional (one kernel writes it, where each of them would be a kernel
            # after it, a select of the old and new values)
            def accept():
                factor = _factorised(residuals.jacobian(t.x, self.m), t.r)
                return jnp.concatenate(
                    [
                        factor.ravel(),
                        t.x,
                        factor[:, :-1].T @ factor[:, -1],
                        (0.5 * t.get("sum_squares"))[None],
                    ]
                )

            size = state.factor.size
            out = lax.cond(
                accepted, accept, lambda: jnp.concatenate([state.factor.ravel(), xf, gf, f[None]])
            )
            factor = out[:size].reshape(state.factor.shape)
            x_new, g_new, f_new = out[size : size + self.n], out[size + self.n : -1], out[-1]
        elif self.dense:
            factor = lax.cond(
                accepted,
                lambda: _factorised(residuals.jacobian(t.x, self.m), t.r),
                lambda: state.factor,
            )
            g_new = jnp.where(
                accepted, (factor[:, :-1].T @ factor[:, -1]).astype(self.dtype), gf
            )  # J^T r
        else:
            factor = state.factor
            g_new = jnp.where(accepted, jax.vjp(residuals, x_new)[1](t.r)[0], gf)
        unravel = ravel_pytree(x)[1]
        nonfinite = state.nonfinite | t.flag("nonfinite")
        new_state = state.after(
            factor, diag, t.get("delta"), t.get("par"), accepted, t.flag("nonfinite")
        )
        return Step(
            unravel(x_new),
            f_new,
            unravel(g_new),
            new_state,
            trials,
            accepted.astype(jnp.int32),
            false,
            t.flag("stalled") & ~accepted,
            nonfinite,
            t.flag("reduction_converged"),
            t.flag("radius_converged"),
        )


@register
@pytree_dataclass
class LevenbergMarquardt(DenseWhenAsked, ClassicalAlgorithm):
    """Levenberg-Marquardt as implemented by Moré: a trust region in the norm scaled by the
    Jacobian's column norms, with the damping parameter found for each radius (Moré, "The
    Levenberg-Marquardt algorithm: implementation and theory", Lecture Notes in
    Mathematics 630, 1978; MINPACK's ``lmder``).

    Each iteration takes the Jacobian J at x and, for the radius delta, the step
    ``p = -(J^T J + lambda D^2)^-1 J^T r`` with lambda = 0 if the Gauss-Newton step fits,
    else ``|D p| ~= delta`` (dense: from an SVD of ``J D^-1``). A trial whose actual to
    predicted reduction ratio is below 1e-4 is rejected and retried with a smaller radius
    (no new Jacobian); the radius follows Moré's rules. The scaling D is the running
    maximum of J's column norms. Matrix-free ("cg"), the step is a Steihaug-CG solution of
    the Gauss-Newton model within ``|p| <= delta`` (unscaled). It stops when the gradient
    ``J^T r`` meets gtol, when the actual and predicted relative reductions of ``|r|^2``
    are both <= ftol, or when ``delta <= xtol |D x|`` (Moré's tests; ftol and xtol are
    ``solve`` options, default 1e-8 as in MINPACK and scipy, or ``4 eps sqrt(m)`` for m
    residuals where the dtype's eps makes that larger: float32, whose rounding a 1e-8
    test cannot see past).

    Counts: ``f_evals`` are residual evaluations (trials), ``grad_evals`` Jacobian
    evaluations, each with the driver's one at x0.

    Args:
      factor: the first radius is ``factor |D x0|`` (``factor`` if that is 0); default 100.
      max_trials: the most trial steps per iteration before it ends without a step (static;
        default 30).
      linear_solver: "auto" (default: dense for at most 256 parameters and 2^24 Jacobian
        entries, else matrix-free), "dense" or "cg" (static).
      cg_rtol: the relative residual at which CG stops (matrix-free; default 1e-6).
      cg_maxiter: the most CG iterations per step (static; default 2n).

    Example:
      >>> sol = optsolve.solve(optsolve.LeastSquaresProblem(r, x0, p),
      ...                      optsolve.LevenbergMarquardt())
    """

    needs_residuals: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 1000
    # a RootProblem is solved as the least-squares problem of F (solve_api/roots.py)
    solves_roots: ClassVar[str] = "residuals"

    factor: Any = 100.0
    max_trials: int = static_field(default=30)
    linear_solver: str = static_field(default="auto")
    cg_rtol: Any = 1e-6
    cg_maxiter: int | None = static_field(default=None)

    def __post_init__(self):
        check_positive("LevenbergMarquardt", "factor", self.factor)
        check_positive("LevenbergMarquardt", "cg_rtol", self.cg_rtol)
        if (
            isinstance(self.max_trials, bool)
            or not isinstance(self.max_trials, int)
            or self.max_trials < 1
        ):
            raise ValueError(
                "LevenbergMarquardt: `max_trials` must be an integer >= 1, got "
                f"{self.max_trials!r}."
            )
        _check_linear_solver("LevenbergMarquardt", self.linear_solver)

    def make_solver(self, problem: LeastSquaresProblem) -> _LevenbergMarquardtSolver:
        return _LevenbergMarquardtSolver(self, problem)
