"""Derivatives of constrained solutions, x* and f*, with respect to p and to the bounds of
the constraints and of the box, through the KKT adjoint in both modes, against
central finite differences of the problem solved again, on ten Hock-Schittkowski problems
whose solutions have active constraints. Reverse mode is jax.jacrev and jax.grad; forward
mode, JVPs of ``jax.linearize``.

Reference: W. Hock and K. Schittkowski, *Test Examples for Nonlinear Programming Codes*,
Lecture Notes in Economics and Mathematical Systems 187, Springer (1981): the problems keep
their numbers, and their published f* (with x* and the multipliers where they are published
or have a closed form) is asserted at the nominal p. Each problem gets hyperparameters p,
coefficients of its objective or of a constraint, whose nominal values give the published
problem; every finite bound (of a constraint and of the box) is a traced leaf too
(``Constraint(g, lower=..., upper=...)``, ``bounds=(lower, upper)``). The derivatives are
those with respect to one vector theta of p and the finite bounds (an equality's lower and
upper bound are one entry, so that it stays an equality), and -multiplier is f*'s
derivative with respect to each constraint's active bound (the envelope theorem).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import brentq

import optsolve
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve

INF = np.inf
# differences of solutions over steps of 1e-5 need x* to about 1e-12
IP = optsolve.InteriorPoint(tol=1e-12)
SLSQP = optsolve.ScipyMinimize("SLSQP")
# the problems whose derivatives through SLSQP's solution are checked too
WITH_SLSQP = ("HS014", "HS071")
STEP = 1e-5  # relative to max(1, |theta_i|)
RTOL, ATOL = 1e-5, 1e-6


class HS(NamedTuple):
    """One Hock-Schittkowski problem with hyperparameters: the constraints are
    ``lower[j] <= g[j](x, p) <= upper[j]``, the box ``box[0] <= x <= box[1]`` (None for
    none); at p = p0, f_star, and x_star and the multipliers (optsolve's sign, one per
    constraint) where known (else None)."""

    name: str
    f: Callable
    g: tuple
    lower: tuple
    upper: tuple
    box: tuple | None
    x0: tuple
    p0: tuple
    f_star: float
    x_star: tuple | None
    multipliers: tuple | None = None


def _hs007_f(x, p):
    return jnp.log(1 + x[0] ** 2) - p[1] * x[1] + p[0] * x[0]


def _hs007_g(x, p):
    return (1 + x[0] ** 2) ** 2 + x[1] ** 2


def _hs010_f(x, p):
    return p[0] * x[0] - x[1]


def _hs010_g(x, p):
    return -3 * x[0] ** 2 + 2 * x[0] * x[1] - x[1] ** 2


def _hs011_f(x, p):
    return (x[0] - p[0]) ** 2 + x[1] ** 2 - 25


def _hs011_g(x, p):
    return p[1] * x[1] - x[0] ** 2


def _hs014_f(x, p):
    return (x[0] - p[0]) ** 2 + (x[1] - 1) ** 2


def _hs014_g1(x, p):
    return x[0] - 2 * x[1]


def _hs014_g2(x, p):
    return x[0] ** 2 / 4 + p[1] * x[1] ** 2


def _hs015_f(x, p):
    return p[0] * (x[1] - x[0] ** 2) ** 2 + (1 - x[0]) ** 2


def _hs015_g1(x, p):
    return p[1] * x[0] * x[1]


def _hs015_g2(x, p):
    return x[0] + x[1] ** 2


def _hs043_f(x, p):
    return (
        x[0] ** 2
        + x[1] ** 2
        + 2 * x[2] ** 2
        + x[3] ** 2
        - p[0] * x[0]
        - p[1] * x[1]
        - p[2] * x[2]
        + p[3] * x[3]
    )


def _hs043_g(x, p):
    return jnp.stack(
        [
            x[0] ** 2 + x[1] ** 2 + x[2] ** 2 + x[3] ** 2 + x[0] - x[1] + x[2] - x[3],
            x[0] ** 2 + 2 * x[1] ** 2 + x[2] ** 2 + 2 * x[3] ** 2 - x[0] - x[3],
            2 * x[0] ** 2 + x[1] ** 2 + x[2] ** 2 + 2 * x[0] - x[1] - x[3],
        ]
    )


def _hs065_f(x, p):
    return (x[0] - x[1]) ** 2 + (x[0] + x[1] - p[0]) ** 2 / 9 + (x[2] - p[1]) ** 2


def _hs065_g(x, p):
    return jnp.sum(x**2)


def _hs071_f(x, p):
    return p[0] * x[0] * x[3] * (x[0] + x[1] + x[2]) + p[1] * x[2]


def _hs071_g1(x, p):
    return jnp.prod(x)


def _hs071_g2(x, p):
    return jnp.sum(x**2)


def _hs076_f(x, p):
    return (
        x[0] ** 2
        + 0.5 * x[1] ** 2
        + x[2] ** 2
        + 0.5 * x[3] ** 2
        - x[0] * x[2]
        + x[2] * x[3]
        + jnp.dot(p, x)
    )


def _hs076_g1(x, p):
    return jnp.stack([x[0] + 2 * x[1] + x[2] + x[3], 3 * x[0] + x[1] + 2 * x[2] - x[3]])


def _hs076_g2(x, p):
    return x[1] + 4 * x[2]


def _hs100_f(x, p):
    return (
        (x[0] - p[0]) ** 2
        + 5 * (x[1] - p[1]) ** 2
        + x[2] ** 4
        + 3 * (x[3] - p[2]) ** 2
        + 10 * x[4] ** 6
        + 7 * x[5] ** 2
        + x[6] ** 4
        - 4 * x[5] * x[6]
        - 10 * x[5]
        - 8 * x[6]
    )


def _hs100_g(x, p):
    return jnp.stack(
        [
            2 * x[0] ** 2 + 3 * x[1] ** 4 + x[2] + 4 * x[3] ** 2 + 5 * x[4],
            7 * x[0] + 3 * x[1] + 10 * x[2] ** 2 + x[3] - x[4],
            23 * x[0] + x[1] ** 2 + 6 * x[5] ** 2 - 8 * x[6],
            4 * x[0] ** 2 + x[1] ** 2 - 3 * x[0] * x[1] + 2 * x[2] ** 2 + 5 * x[5] - 11 * x[6],
        ]
    )


# HS011: on the active constraint x2 = x1^2, so x1* is the real root of 2 t^3 + t - 5
_HS011_X1 = float(np.real(next(r for r in np.roots([2.0, 0.0, 1.0, -5.0]) if abs(r.imag) < 1e-12)))
# HS065: x1* = x2* (f and the ball are symmetric in them) and x3* = sqrt(48 - 2 x1*^2) on the
# ball, x1* the root of the stationarity along the ball (2 t - 10) / 9 = t (x3 - 5) / x3
_HS065_X1 = brentq(
    lambda t: (2 * t - 10) / 9 + t * (5 - np.sqrt(48 - 2 * t * t)) / np.sqrt(48 - 2 * t * t),
    3.0,
    4.5,
    xtol=1e-15,
)
_HS065_X = (_HS065_X1, _HS065_X1, float(np.sqrt(48 - 2 * _HS065_X1**2)))
_SQRT3, _SQRT7 = np.sqrt(3.0), np.sqrt(7.0)

PROBLEMS = [
    # f* = -sqrt(3) at (0, sqrt(3)), an equality; p0 tilts f (0 in HS007), p1 scales x2's term
    HS(
        "HS007",
        _hs007_f,
        (_hs007_g,),
        (4.0,),
        (4.0,),
        None,
        (2.0, 2.0),
        (0.0, 1.0),
        -_SQRT3,
        (0.0, _SQRT3),
        (1 / (2 * _SQRT3),),
    ),
    # f* = -1 at (0, 1), the inequality held at its lower bound
    HS(
        "HS010",
        _hs010_f,
        (_hs010_g,),
        (-1.0,),
        (INF,),
        None,
        (-10.0, 10.0),
        (1.0,),
        -1.0,
        (0.0, 1.0),
        (-0.5,),
    ),
    HS(
        "HS011",
        _hs011_f,
        (_hs011_g,),
        (0.0,),
        (INF,),
        None,
        (4.9, 0.1),
        (5.0, 1.0),
        -8.498464223,
        (_HS011_X1, _HS011_X1**2),
    ),
    # f* = 9 - 2.875 sqrt(7) at ((sqrt(7) - 1)/2, (sqrt(7) + 1)/4): an equality and an
    # inequality, both active
    HS(
        "HS014",
        _hs014_f,
        (_hs014_g1, _hs014_g2),
        (-1.0, -INF),
        (-1.0, 1.0),
        None,
        (2.0, 2.0),
        (2.0, 1.0),
        9 - 2.875 * _SQRT7,
        ((_SQRT7 - 1) / 2, (_SQRT7 + 1) / 4),
    ),
    # f* = 306.5 at (0.5, 2): the box's x1 <= 0.5 and x1 x2 >= 1 hold it (a vertex)
    HS(
        "HS015",
        _hs015_f,
        (_hs015_g1, _hs015_g2),
        (1.0, 0.0),
        (INF, INF),
        ((-INF, -INF), (0.5, INF)),
        (-2.0, 1.0),
        (100.0, 1.0),
        306.5,
        (0.5, 2.0),
        (-700.0, 0.0),
    ),
    # Rosen-Suzuki: f* = -44 at (0, 1, 2, -1), the first and third constraints active with
    # the published multipliers (1, 0, 2)
    HS(
        "HS043",
        _hs043_f,
        (_hs043_g,),
        ((-INF, -INF, -INF),),
        ((8.0, 10.0, 5.0),),
        None,
        (0.0, 0.0, 0.0, 0.0),
        (5.0, 5.0, 21.0, 7.0),
        -44.0,
        (0.0, 1.0, 2.0, -1.0),
        ((1.0, 0.0, 2.0),),
    ),
    # the ball's bound active, the box not (HS065's x0 lies outside the box: projected)
    HS(
        "HS065",
        _hs065_f,
        (_hs065_g,),
        (-INF,),
        (48.0,),
        ((-4.5, -4.5, -5.0), (4.5, 4.5, 5.0)),
        (-5.0, 5.0, 0.0),
        (10.0, 5.0),
        0.9535288567,
        _HS065_X,
    ),
    # x1 = 1 held by the box, the product's bound and the equality active (multipliers:
    # IPOPT's, as tests/backends/constrained/test_interior_point.py checks)
    HS(
        "HS071",
        _hs071_f,
        (_hs071_g1, _hs071_g2),
        (25.0, 40.0),
        (INF, 40.0),
        ((1.0,) * 4, (5.0,) * 4),
        (1.0, 5.0, 5.0, 1.0),
        (1.0, 1.0),
        17.0140173,
        (1.0, 4.7429994, 3.8211503, 1.3794082),
        (-0.55229366, 0.16146857),
    ),
    # f* = -103/22 at (3, 23, 0, 6)/11: x3 = 0 held by the box, the first constraint
    # active with multiplier 5/11
    HS(
        "HS076",
        _hs076_f,
        (_hs076_g1, _hs076_g2),
        ((-INF, -INF), 1.5),
        ((5.0, 4.0), INF),
        ((0.0,) * 4, (INF,) * 4),
        (0.5, 0.5, 0.5, 0.5),
        (-1.0, -3.0, 1.0, -1.0),
        -4.681818181,
        (3 / 11, 23 / 11, 0.0, 6 / 11),
        ((5 / 11, 0.0), 0.0),
    ),
    # seven variables, the first and fourth constraints active
    HS(
        "HS100",
        _hs100_f,
        (_hs100_g,),
        ((-INF,) * 4,),
        ((127.0, 282.0, 196.0, 0.0),),
        None,
        (1.0, 2.0, 0.0, 4.0, 0.0, 1.0, 1.0),
        (10.0, 12.0, 11.0),
        680.6300573,
        (2.330499, 1.951372, -0.4775414, 4.365726, -0.6244870, 1.038131, 1.594227),
    ),
]


class Layout:
    """Where each entry of theta goes: p first, then each constraint's finite bounds (an
    equality's once, for both), then the box's finite bounds."""

    def __init__(self, case: HS):
        self.case = case
        self.theta0, self.kinds = list(case.p0), ["p"] * len(case.p0)
        # per constraint: the indices into theta of its lower and upper bounds (-1: not in
        # theta) and their nominal values
        self.slots = []
        for j, (lo, up) in enumerate(zip(case.lower, case.upper)):
            lo, up = np.asarray(lo, float), np.asarray(up, float)
            lo, up = np.broadcast_arrays(lo, up)
            li, ui = np.full(lo.shape, -1), np.full(up.shape, -1)
            for k in np.ndindex(lo.shape):
                if np.isfinite(lo[k]):
                    li[k] = self._add(lo[k], ("lower", j, k))
                if lo[k] == up[k]:
                    ui[k] = li[k]
                elif np.isfinite(up[k]):
                    ui[k] = self._add(up[k], ("upper", j, k))
            self.slots.append((li, ui, lo, up))
        self.box_slots = None
        if case.box is not None:
            self.box_slots = []
            for side, values in zip(("box lower", "box upper"), case.box):
                values = np.asarray(values, float)
                idx = np.array(
                    [
                        self._add(v, (side, i)) if np.isfinite(v) else -1
                        for i, v in enumerate(values)
                    ]
                )
                self.box_slots.append((idx, values))
        self.theta0 = np.array(self.theta0)

    def _add(self, value, kind):
        self.theta0.append(float(value))
        self.kinds.append(kind)
        return len(self.theta0) - 1

    @staticmethod
    def _fill(theta, idx, values):
        return jnp.where(idx >= 0, theta[np.maximum(idx, 0)], values)

    def problem(self, theta):
        case = self.case
        constraints = [
            Constraint(g, lower=self._fill(theta, li, lo), upper=self._fill(theta, ui, up))
            for g, (li, ui, lo, up) in zip(case.g, self.slots)
        ]
        x0 = jnp.asarray(case.x0, float)
        bounds = None
        if self.box_slots is not None:
            bounds = tuple(self._fill(theta, idx, values) for idx, values in self.box_slots)
            # HS065's x0 lies outside its box, and HS071's on a bound that a difference
            # step moves: x0 projected here, as solve would, without its warning
            x0 = jnp.clip(x0, *jax.lax.stop_gradient(bounds))
        return OptimizationProblem(
            case.f, x0, theta[: len(case.p0)], bounds=bounds, constraints=constraints
        )


def _solution(layout, algorithm, **options):
    def solution(theta):
        sol = solve(layout.problem(theta), algorithm, **options)
        return sol.x, sol.objective

    return solution


def _central_differences(solution, theta0):
    """(dx*/dtheta, df*/dtheta) by central differences, each entry's step
    STEP max(1, |theta_i|), every point solved from x0."""
    h = STEP * np.maximum(1.0, np.abs(theta0))
    dx, df = [], []
    for i, hi in enumerate(h):
        step = np.zeros_like(theta0)
        step[i] = hi
        (x_plus, f_plus), (x_minus, f_minus) = (
            solution(jnp.asarray(theta0 + s * step)) for s in (1, -1)
        )
        dx.append((np.asarray(x_plus) - np.asarray(x_minus)) / (2 * hi))
        df.append((float(f_plus) - float(f_minus)) / (2 * hi))
    return np.stack(dx, axis=1), np.array(df)


def _envelope(layout, multipliers):
    """-multiplier where theta's entry is a constraint's bound that holds (0 at a bound that
    does not; optsolve's sign: lambda <= 0 at a lower bound, >= 0 at an upper one): indices
    into theta and the expected df*/dtheta there."""
    expected = {}
    for (li, ui, _lo, _up), lam in zip(layout.slots, multipliers):
        lam = np.broadcast_to(np.asarray(lam), li.shape)
        for k in np.ndindex(li.shape):
            if li[k] >= 0 and li[k] == ui[k]:  # an equality: one entry, either sign
                expected[li[k]] = -lam[k]
                continue
            if li[k] >= 0:
                expected[li[k]] = -min(lam[k], 0.0)
            if ui[k] >= 0:
                expected[ui[k]] = -max(lam[k], 0.0)
    return np.array(list(expected), int), np.array(list(expected.values()))


@pytest.mark.parametrize("case", PROBLEMS, ids=[c.name for c in PROBLEMS])
def test_derivatives_equal_central_differences(case):
    """At the nominal p: SUCCESS, the published f* (x* and multipliers where known). Then
    dx*/dtheta and df*/dtheta by jax.jacrev, jax.grad and forward mode against central
    differences, df*/d(bound) = -multiplier, and (a subset) the same through SLSQP."""
    layout = Layout(case)
    theta0 = layout.theta0
    solution = _solution(layout, IP)

    sol = solve(layout.problem(jnp.asarray(theta0)), IP)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, case.f_star, rtol=1e-9, atol=1e-9)
    if case.x_star is not None:
        np.testing.assert_allclose(sol.x, case.x_star, rtol=1e-6, atol=1e-6)
    if case.multipliers is not None:
        for own, published in zip(sol.multipliers, case.multipliers):
            np.testing.assert_allclose(own, published, rtol=1e-6, atol=1e-7)

    fd_x, fd_f = _central_differences(solution, theta0)
    rev_x, rev_f = jax.jacrev(solution)(jnp.asarray(theta0))
    grad_f = jax.grad(lambda theta: solution(theta)[1])(jnp.asarray(theta0))
    # forward mode: one JVP per entry of theta, of the solve linearised once (jax.jacfwd's
    # JVPs, without its second trace of the tangent rule batched)
    jvp = jax.linearize(solution, jnp.asarray(theta0))[1]
    fwd_x, fwd_f = jax.vmap(jvp, out_axes=-1)(jnp.eye(theta0.size))
    theta = f"theta = {layout.kinds}"
    for mode, (dx, df) in {
        "jacrev": (rev_x, rev_f),
        "forward": (fwd_x, fwd_f),
        "grad": (None, grad_f),
    }.items():
        if dx is not None:
            np.testing.assert_allclose(
                dx,
                fd_x,
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"{case.name}: dx*/dtheta by {mode}; {theta}",
            )
        np.testing.assert_allclose(
            df, fd_f, rtol=RTOL, atol=ATOL, err_msg=f"{case.name}: df*/dtheta by {mode}; {theta}"
        )

    # the envelope theorem: df*/d(bound) = -multiplier, at the run's own multipliers
    indices, expected = _envelope(layout, sol.multipliers)
    np.testing.assert_allclose(
        np.asarray(rev_f)[indices],
        expected,
        rtol=1e-6,
        atol=1e-7,
        err_msg=f"{case.name}: df*/d(bound) against -multiplier",
    )

    if case.name in WITH_SLSQP:
        # SLSQP's solution differentiated by the same KKT adjoint, against the same
        # differences (x*(theta) is one function; InteriorPoint's solves resolve it finer)
        slsqp = _solution(layout, SLSQP, ftol=1e-12, maxiters=500)
        np.testing.assert_allclose(slsqp(jnp.asarray(theta0))[1], case.f_star, rtol=1e-9, atol=1e-9)
        rev_x, rev_f = jax.jacrev(slsqp)(jnp.asarray(theta0))
        np.testing.assert_allclose(
            rev_x,
            fd_x,
            rtol=RTOL,
            atol=ATOL,
            err_msg=f"{case.name}: dx*/dtheta through SLSQP; {theta}",
        )
        np.testing.assert_allclose(
            rev_f,
            fd_f,
            rtol=RTOL,
            atol=ATOL,
            err_msg=f"{case.name}: df*/dtheta through SLSQP; {theta}",
        )
