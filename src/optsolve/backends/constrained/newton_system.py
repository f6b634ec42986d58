"""The interior-point method's Newton system, dense, with IPOPT's inertia correction.

The primal-dual system in (dx, ds, dy) (Wächter & Biegler 2006, eq. (13)) is condensed by
eliminating the slacks' step ``ds = (dy + y - grad_s phi) / (Sigma_s + delta_w)``:

    [ W + Sigma_x + delta_w I     J^T ] [dx]   [ -(grad_x phi + J^T y)                    ]
    [ J                           -D  ] [dy] = [ -(c - s) + (y - grad_s phi)/(Sigma_s + delta_w) ]

with ``D = delta_c + 1/(Sigma_s + delta_w)`` on inequality rows, ``delta_c`` on equality
rows, and an identity row (dy = 0) for rows that constrain nothing. The full system has the
inertia (n + m_I, m, 0) that makes the step a descent direction of the barrier problem
exactly when this one has (n, m, 0): the eliminated block is positive.

JAX has no symmetric indefinite (Bunch-Kaufman) factorisation, so the matrix is factorised
as ``L D L^T`` without pivoting, in its natural order (the x block, then the rows): the
inertia is the signs of D (Sylvester's law of inertia), and a pivot too small to trust
counts as a zero eigenvalue. Once corrected, the matrix is quasi-definite (a positive
definite x block, a negative definite Schur complement), which such an ordering factorises
stably (Vanderbei, SIAM J. Optim. 5 (1995), 100-113). Written here as one
loop over the columns of elementwise updates, it is the same program for one problem and,
under ``jax.vmap``, for a batch (LAPACK's eigendecomposition runs one matrix at a time). A
wrong inertia
is corrected as IPOPT's Algorithm IC (§3.1): ``delta_c = 1e-8 mu^(1/4)`` where the matrix
is singular, and ``delta_w`` from ``1e-4`` (or a third of the last one) up by 100x (first
time) or 8x, until the inertia is right or ``delta_w`` passes 1e40 (the step then fails and
the method turns to feasibility restoration).

Where the inequality rows far outnumber the variables and the equality rows
(``NLP.condensed``), the inequality rows are eliminated as well, ``dy_I = D_I^-1 (J_I dx -
r_I)``, leaving the system in x and the equality rows E

    [ W + Sigma_x + delta_w I + J_I^T D_I^-1 J_I   J_E^T     ] [dx  ]   [ r_x + J_I^T D_I^-1 r_I ]
    [ J_E                                         -delta_c I ] [dy_E] = [ r_E                  ],

whose inertia is the full system's less the m_I negative eigenvalues of -D_I (Haynsworth):
the inertia is right exactly when it is (n, m_E, 0), which the same ``L D L^T`` reads
(without equality rows: positive definite, the n x n primal Schur complement). Its cost is
m n^2 to form and (n + m_E)^3 to factorise, against (n + m)^3 (IPOPT reaches the same with
a sparse factorisation).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.constrained.nlp import NLP

Array = jax.Array

_DELTA_W_FIRST, _DELTA_W_MIN, _DELTA_W_MAX = 1e-4, 1e-20, 1e40
_KAPPA_W_MINUS, _KAPPA_W_PLUS, _KAPPA_W_PLUS_FIRST = 1.0 / 3.0, 8.0, 100.0
_DELTA_C, _KAPPA_C = 1e-8, 0.25


class Factorised(NamedTuple):
    """The corrected condensed matrix as ``L D L^T``, with what built it."""

    lower: Array  # L, unit lower triangular
    pivots: Array  # D's diagonal
    delta_w: Array
    delta_c: Array
    sigma_s: Array  # Sigma_s + delta_w on inequality rows (1 elsewhere)
    ok: Array  # the inertia was corrected within delta_w's range
    weights: Array  # the condensed form's D_I^-1 on the inequality rows (0 elsewhere;
    # else empty)


def _matrix(
    nlp: NLP, hessian: Array, jac: Array, sigma: Array, delta_w: Array, delta_c: Array
) -> tuple[Array, Array, Array]:
    """The matrix to factorise, Sigma_s + delta_w, and (condensed form) D^-1."""
    n, free = nlp.n, nlp.free_x
    # a fixed variable's row and column: the identity (its step is 0)
    top = jnp.where(free[:, None] & free[None, :], hessian, 0.0) + jnp.diag(
        jnp.where(free, sigma[:n] + delta_w, 1.0)
    )
    sigma_s = jnp.where(nlp.ineq, sigma[n:] + delta_w, 1.0)
    d = jnp.where(nlp.ineq, delta_c + 1.0 / sigma_s, jnp.where(nlp.eq, delta_c, 1.0))
    jac = jnp.where(nlp.rows[:, None] & free[None, :], jac, 0.0)
    if nlp.condensed:
        # bounds traced (eq_rows None): an equality row cannot be kept, and its NaN weight
        # fails the factorisation rather than drop the row
        eq_weight = jnp.nan if nlp.eq_rows is None else 0.0
        weights = jnp.where(nlp.ineq, 1.0 / d, jnp.where(nlp.eq, eq_weight, 0.0))
        reduced = top + jac.T @ (weights[:, None] * jac)
        rows = nlp._eq_rows()
        if not rows.size:
            return reduced, sigma_s, weights
        jac_e = jac[rows]
        matrix = jnp.block(
            [[reduced, jac_e.T], [jac_e, -delta_c * jnp.eye(rows.size, dtype=d.dtype)]]
        )
        return matrix, sigma_s, weights
    matrix = jnp.block([[top, jac.T], [jac, -jnp.diag(d)]])
    return matrix, sigma_s, jnp.zeros(0, d.dtype)


def ldl(matrix: Array) -> tuple[Array, Array]:
    """``(L, d)`` with ``matrix = L diag(d) L^T``, no pivoting; a zero pivot gives d_j = 0
    and a zero column of L below it (the inertia test then calls the matrix singular)."""
    size = matrix.shape[0]
    index = jnp.arange(size)

    def column(j, carry):
        work, lower, pivots = carry
        pivot = work[j, j]
        below = index > j
        safe = jnp.where(pivot != 0, pivot, 1.0)
        l_j = jnp.where(below & (pivot != 0), work[:, j] / safe, 0.0)
        # the trailing block's Schur complement: work - pivot l_j l_j^T (rows and columns > j)
        work = work - pivot * jnp.outer(l_j, l_j)
        lower = lower.at[:, j].set(jnp.where(index == j, 1.0, l_j))
        return work, lower, pivots.at[j].set(pivot)

    zero = jnp.zeros_like(matrix)
    _, lower, pivots = lax.fori_loop(0, size, column, (matrix, zero, jnp.zeros(size, matrix.dtype)))
    return lower, pivots


def _inertia(pivots: Array, scale: Array, n: int) -> tuple[Array, Array]:
    """(right, singular): n positive pivots and the rest negative; any pivot within
    rounding of zero, relative to ``scale`` (one per pivot: the larger of its row's largest
    entry and the sum its elimination subtracted)."""
    size = pivots.size
    zero_tol = size * jnp.finfo(pivots.dtype).eps * jnp.where(scale > 0, scale, 1.0)
    positive = jnp.sum(pivots > zero_tol)
    negative = jnp.sum(pivots < -zero_tol)
    singular = positive + negative < size
    return (positive == n) & (negative == size - n) & ~singular, singular


class Schedule(NamedTuple):
    """Algorithm IC's numbers for one step: delta_c (where the system is singular), the
    first delta_w to try, its growth factor, and the largest delta_w."""

    delta_c: Array
    first: Array
    grow: Array
    most: float


def schedule(delta_w_last: Array, mu: Array, singular: Array, dtype) -> Schedule:
    """IPOPT's Algorithm IC (§3.1), shared by the dense and matrix-free systems."""
    zero = jnp.zeros((), dtype)
    delta_c = jnp.where(singular, _DELTA_C * mu**_KAPPA_C, zero).astype(dtype)
    first = jnp.where(
        delta_w_last == 0, _DELTA_W_FIRST, jnp.maximum(_DELTA_W_MIN, _KAPPA_W_MINUS * delta_w_last)
    ).astype(dtype)
    grow = jnp.where(delta_w_last == 0, _KAPPA_W_PLUS_FIRST, _KAPPA_W_PLUS).astype(dtype)
    # 1e40 does not fit in float32: there, some way below its largest number
    most = min(_DELTA_W_MAX, float(jnp.finfo(dtype).max) * 1e-8)
    return Schedule(delta_c, first, grow, most)


def factorise(
    nlp: NLP, hessian: Array, jac: Array, sigma: Array, mu: Array, delta_w_last: Array
) -> Factorised:
    """The condensed matrix with IPOPT's inertia correction (Algorithm IC)."""
    dtype = hessian.dtype
    zero = jnp.zeros((), dtype)

    def decompose(delta_w, delta_c):
        matrix, sigma_s, weights = _matrix(nlp, hessian, jac, sigma, delta_w, delta_c)
        lower, pivots = ldl(matrix)
        # each pivot against its own row's entries (a global scale is delta_w's once it
        # grows, under which every constraint row's pivot reads as zero) and against what
        # its elimination subtracted, sum_j L_kj^2 |d_j|: its rounding error's size
        scale = jnp.maximum(
            jnp.max(jnp.abs(matrix), axis=1, initial=0.0), (lower**2) @ jnp.abs(pivots)
        )
        right, singular = _inertia(pivots, scale, nlp.n)
        right = right & jnp.all(jnp.isfinite(pivots)) & jnp.all(jnp.isfinite(lower))
        return lower, pivots, sigma_s, weights, right, singular

    lower, pivots, sigma_s, weights, right, singular = decompose(zero, zero)
    plan = schedule(delta_w_last, mu, singular, dtype)
    delta_c = plan.delta_c

    class Carry(NamedTuple):
        delta_w: Array
        lower: Array
        pivots: Array
        sigma_s: Array
        weights: Array
        right: Array

    def cond(c: Carry) -> Array:
        return ~c.right & (c.delta_w <= plan.most)

    def body(c: Carry) -> Carry:
        lower, pivots, sigma_s, weights, right, _ = decompose(c.delta_w, delta_c)
        delta_w = jnp.where(right, c.delta_w, plan.grow * c.delta_w).astype(dtype)
        return Carry(delta_w, lower, pivots, sigma_s, weights, right)

    # a loop from the first decomposition, not a cond around one: under vmap a cond runs
    # both branches, and so the loop's first trial for every member; here a member whose
    # inertia is already right starts (and stays) done, with delta_w = 0
    start = Carry(
        jnp.where(right, zero, plan.first).astype(dtype), lower, pivots, sigma_s, weights, right
    )
    corrected = lax.while_loop(cond, body, start)
    delta_c = jnp.where(right, zero, delta_c)
    return Factorised(
        corrected.lower,
        corrected.pivots,
        corrected.delta_w,
        delta_c,
        corrected.sigma_s,
        corrected.right,
        corrected.weights,
    )


def _ldl_solve(fact: Factorised, rhs: Array) -> Array:
    """``M^-1 rhs`` from ``M = L D L^T`` (a zero pivot's component left at 0)."""
    lower, pivots = fact.lower, fact.pivots
    z = jax.scipy.linalg.solve_triangular(lower, rhs, lower=True, unit_diagonal=True)
    z = jnp.where(pivots != 0, z / jnp.where(pivots != 0, pivots, 1.0), 0.0)
    return jax.scipy.linalg.solve_triangular(lower.T, z, lower=False, unit_diagonal=True)


def solve(nlp: NLP, fact: Factorised, jac: Array, rhs: Array) -> Array:
    """``K^-1 rhs`` for the condensed system K: from its factors, or (condensed form) from
    the primal Schur complement's, then ``dy = D^-1 (J dx - r_y)``."""
    if not nlp.condensed:
        return _ldl_solve(fact, rhs)
    n, rows = nlp.n, nlp._eq_rows()
    jac = jnp.where(nlp.rows[:, None] & nlp.free_x[None, :], jac, 0.0)
    r_x, r_y = rhs[:n], rhs[n:]
    step = _ldl_solve(fact, jnp.concatenate([r_x + jac.T @ (fact.weights * r_y), r_y[rows]]))
    dx = step[:n]
    return jnp.concatenate([dx, (fact.weights * (jac @ dx - r_y)).at[rows].set(step[n:])])


def direction(
    nlp: NLP, fact: Factorised, grad_phi: Array, jac: Array, y: Array, residual: Array
) -> tuple[Array, Array, Array]:
    """(dx, ds, dy) of the Newton step; ``residual`` is the constraints' (c - s), which a
    second-order correction replaces."""
    n = nlp.n
    jac = jnp.where(nlp.rows[:, None], jac, 0.0)
    g_x, g_s = grad_phi[:n], grad_phi[n:]
    slack_term = jnp.where(nlp.ineq, (y - g_s) / fact.sigma_s, 0.0)
    rhs = jnp.concatenate(
        [
            jnp.where(nlp.free_x, -(g_x + jac.T @ y), 0.0),
            jnp.where(nlp.rows, -residual + slack_term, 0.0),
        ]
    )
    step = solve(nlp, fact, jac, rhs)
    dx, dy = step[:n], step[n:]
    ds = jnp.where(nlp.ineq, (dy + y - g_s) / fact.sigma_s, 0.0)
    return dx, ds, dy
