"""Shared reference problems: the unconstrained test set of Moré, Garbow & Hillstrom.

J. J. Moré, B. S. Garbow, K. E. Hillstrom, "Testing Unconstrained Optimization Software",
ACM Trans. Math. Software 7(1), 17-41 (1981), section 3 (problem numbers below are theirs).
Each problem is ``f(x) = sum_i f_i(x)^2`` with the paper's standard starting point ``x0``.

``minima`` holds the minimum values the paper publishes (where it lists more than one
local minimum, all of them: a local method may legitimately reach any), ``published``
their printed digits. The paper prints 6 significant digits, too few for the
``f <= f* + 1e-8 (1 + |f*|)`` test, so each value is refined here by a tight Newton/LM
solve in float64 started next to the published minimiser; ``test_reference_values`` checks
the refined values against the printed ones. Minima at infinity (Bard 17.4286,
Kowalik-Osborne 1.02734e-3) and Biggs' 5.65565e-3 keep the printed value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

CITATION = (
    "J. J. Moré, B. S. Garbow, K. E. Hillstrom, Testing Unconstrained Optimization "
    "Software, ACM TOMS 7(1):17-41, 1981"
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One reference problem.

    Attributes:
      name: the paper's name (with its number).
      residuals: ``r(x) -> array``; the objective is ``sum(r(x)**2)``.
      x0: the standard starting point.
      minima: refined minimum values (float64); the global one first.
      published: the values as printed in the paper.
    """

    name: str
    residuals: Callable
    x0: tuple
    minima: tuple
    published: tuple

    def f(self, x, p=None):
        r = self.residuals(x)
        return jnp.sum(r * r)

    def x0_array(self, dtype=jnp.float64):
        return jnp.asarray(self.x0, dtype)

    def reached(self, value: float, rtol: float = 1e-8) -> bool:
        """True when ``value`` is within ``rtol (1 + |f*|)`` above some published minimum."""
        return any(value <= m + rtol * (1 + abs(m)) for m in self.minima)


def _c(values, x):
    return jnp.asarray(values, x.dtype)


# --- the residual functions, numbered as in the paper


def rosenbrock(x):  # 1
    return jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])


def freudenstein_roth(x):  # 2
    return jnp.stack(
        [-13 + x[0] + ((5 - x[1]) * x[1] - 2) * x[1], -29 + x[0] + ((x[1] + 1) * x[1] - 14) * x[1]]
    )


def powell_badly_scaled(x):  # 3
    return jnp.stack([1e4 * x[0] * x[1] - 1, jnp.exp(-x[0]) + jnp.exp(-x[1]) - 1.0001])


def brown_badly_scaled(x):  # 4
    return jnp.stack([x[0] - 1e6, x[1] - 2e-6, x[0] * x[1] - 2])


def beale(x):  # 5
    y = _c([1.5, 2.25, 2.625], x)
    i = _c([1.0, 2.0, 3.0], x)
    return y - x[0] * (1 - x[1] ** i)


def jennrich_sampson(x):  # 6, m = 10
    i = jnp.arange(1, 11, dtype=x.dtype)
    return 2 + 2 * i - (jnp.exp(i * x[0]) + jnp.exp(i * x[1]))


def helical_valley(x):  # 7
    base = jnp.arctan(x[1] / x[0]) / (2 * jnp.pi)
    theta = jnp.where(x[0] > 0, base, base + 0.5)
    return jnp.stack([10 * (x[2] - 10 * theta), 10 * (jnp.sqrt(x[0] ** 2 + x[1] ** 2) - 1), x[2]])


_BARD_Y = [0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39, 0.37, 0.58, 0.73, 0.96, 1.34, 2.10, 4.39]


def bard(x):  # 8
    u = jnp.arange(1, 16, dtype=x.dtype)
    v = 16 - u
    w = jnp.minimum(u, v)
    return _c(_BARD_Y, x) - (x[0] + u / (v * x[1] + w * x[2]))


_GAUSSIAN_Y = [
    0.0009,
    0.0044,
    0.0175,
    0.0540,
    0.1295,
    0.2420,
    0.3521,
    0.3989,
    0.3521,
    0.2420,
    0.1295,
    0.0540,
    0.0175,
    0.0044,
    0.0009,
]


def gaussian(x):  # 9
    t = (8 - jnp.arange(1, 16, dtype=x.dtype)) / 2
    return x[0] * jnp.exp(-x[1] * (t - x[2]) ** 2 / 2) - _c(_GAUSSIAN_Y, x)


_MEYER_Y = [
    34780,
    28610,
    23650,
    19630,
    16370,
    13720,
    11540,
    9744,
    8261,
    7030,
    6005,
    5147,
    4427,
    3820,
    3307,
    2872,
]


def meyer(x):  # 10
    t = 45 + 5 * jnp.arange(1, 17, dtype=x.dtype)
    return x[0] * jnp.exp(x[1] / (t + x[2])) - _c(_MEYER_Y, x)


def gulf(x):  # 11, m = 99
    t = jnp.arange(1, 100, dtype=x.dtype) / 100
    y = 25 + (-50 * jnp.log(t)) ** (2 / 3)
    return jnp.exp(-(jnp.abs(y - x[1]) ** x[2]) / x[0]) - t


def box3d(x):  # 12, m = 10
    t = 0.1 * jnp.arange(1, 11, dtype=x.dtype)
    return jnp.exp(-t * x[0]) - jnp.exp(-t * x[1]) - x[2] * (jnp.exp(-t) - jnp.exp(-10 * t))


def powell_singular(x):  # 13
    return jnp.stack(
        [
            x[0] + 10 * x[1],
            jnp.sqrt(5.0) * (x[2] - x[3]),
            (x[1] - 2 * x[2]) ** 2,
            jnp.sqrt(10.0) * (x[0] - x[3]) ** 2,
        ]
    )


def wood(x):  # 14
    return jnp.stack(
        [
            10 * (x[1] - x[0] ** 2),
            1 - x[0],
            jnp.sqrt(90.0) * (x[3] - x[2] ** 2),
            1 - x[2],
            jnp.sqrt(10.0) * (x[1] + x[3] - 2),
            (x[1] - x[3]) / jnp.sqrt(10.0),
        ]
    )


_KO_Y = [0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627, 0.0456, 0.0342, 0.0323, 0.0235, 0.0246]
_KO_U = [4.0, 2.0, 1.0, 0.5, 0.25, 0.167, 0.125, 0.1, 0.0833, 0.0714, 0.0625]


def kowalik_osborne(x):  # 15
    u = _c(_KO_U, x)
    return _c(_KO_Y, x) - x[0] * (u**2 + u * x[1]) / (u**2 + u * x[2] + x[3])


def brown_dennis(x):  # 16, m = 20
    t = jnp.arange(1, 21, dtype=x.dtype) / 5
    return (x[0] + t * x[1] - jnp.exp(t)) ** 2 + (x[2] + x[3] * jnp.sin(t) - jnp.cos(t)) ** 2


def biggs_exp6(x):  # 18, m = 13
    t = 0.1 * jnp.arange(1, 14, dtype=x.dtype)
    y = jnp.exp(-t) - 5 * jnp.exp(-10 * t) + 3 * jnp.exp(-4 * t)
    return x[2] * jnp.exp(-t * x[0]) - x[3] * jnp.exp(-t * x[1]) + x[5] * jnp.exp(-t * x[4]) - y


_OSBORNE1_Y = [
    0.844,
    0.908,
    0.932,
    0.936,
    0.925,
    0.908,
    0.881,
    0.850,
    0.818,
    0.784,
    0.751,
    0.718,
    0.685,
    0.658,
    0.628,
    0.603,
    0.580,
    0.558,
    0.538,
    0.522,
    0.506,
    0.490,
    0.478,
    0.467,
    0.457,
    0.448,
    0.438,
    0.431,
    0.424,
    0.420,
    0.414,
    0.411,
    0.406,
]


def osborne1(x):  # 17
    t = 10 * jnp.arange(33, dtype=x.dtype)
    return _c(_OSBORNE1_Y, x) - (x[0] + x[1] * jnp.exp(-t * x[3]) + x[2] * jnp.exp(-t * x[4]))


_OSBORNE2_Y = [
    1.366,
    1.191,
    1.112,
    1.013,
    0.991,
    0.885,
    0.831,
    0.847,
    0.786,
    0.725,
    0.746,
    0.679,
    0.608,
    0.655,
    0.616,
    0.606,
    0.602,
    0.626,
    0.651,
    0.724,
    0.649,
    0.649,
    0.694,
    0.644,
    0.624,
    0.661,
    0.612,
    0.558,
    0.533,
    0.495,
    0.500,
    0.423,
    0.395,
    0.375,
    0.372,
    0.391,
    0.396,
    0.405,
    0.428,
    0.429,
    0.523,
    0.562,
    0.607,
    0.653,
    0.672,
    0.708,
    0.633,
    0.668,
    0.645,
    0.632,
    0.591,
    0.559,
    0.597,
    0.625,
    0.739,
    0.710,
    0.729,
    0.720,
    0.636,
    0.581,
    0.428,
    0.292,
    0.162,
    0.098,
    0.054,
]


def osborne2(x):  # 19
    t = jnp.arange(65, dtype=x.dtype) / 10
    model = (
        x[0] * jnp.exp(-t * x[4])
        + x[1] * jnp.exp(-((t - x[8]) ** 2) * x[5])
        + x[2] * jnp.exp(-((t - x[9]) ** 2) * x[6])
        + x[3] * jnp.exp(-((t - x[10]) ** 2) * x[7])
    )
    return _c(_OSBORNE2_Y, x) - model


def watson(x):  # 20, n = 6 (29 + 2 residuals)
    n = x.shape[0]
    t = jnp.arange(1, 30, dtype=x.dtype) / 29
    j = jnp.arange(n, dtype=x.dtype)
    powers = t[:, None] ** j[None, :]  # t^(j-1), j = 1..n
    deriv = jnp.sum(j[1:] * x[1:] * powers[:, :-1], axis=1)  # sum (j-1) x_j t^(j-2)
    value = powers @ x
    return jnp.concatenate([deriv - value**2 - 1, jnp.stack([x[0], x[1] - x[0] ** 2 - 1])])


def extended_rosenbrock(x):  # 21
    odd, even = x[0::2], x[1::2]
    return jnp.concatenate([10 * (even - odd**2), 1 - odd])


def penalty1(x):  # 23, n = 4
    return jnp.concatenate([jnp.sqrt(1e-5) * (x - 1), jnp.stack([jnp.sum(x**2) - 0.25])])


def penalty2(x):  # 24, n = 4
    n = x.shape[0]
    a = 1e-5
    i = jnp.arange(2, n + 1, dtype=x.dtype)
    y = jnp.exp(i / 10) + jnp.exp((i - 1) / 10)
    middle = jnp.sqrt(a) * (jnp.exp(x[1:] / 10) + jnp.exp(x[:-1] / 10) - y)
    tail = jnp.sqrt(a) * (jnp.exp(x[1:] / 10) - jnp.exp(-0.1))
    weights = jnp.arange(n, 0, -1, dtype=x.dtype)
    last = jnp.sum(weights * x**2) - 1
    return jnp.concatenate([jnp.stack([x[0] - 0.2]), middle, tail, jnp.stack([last])])


def variably_dimensioned(x):  # 25, n = 10
    j = jnp.arange(1, x.shape[0] + 1, dtype=x.dtype)
    s = jnp.sum(j * (x - 1))
    return jnp.concatenate([x - 1, jnp.stack([s, s**2])])


def trigonometric(x):  # 26, n = 10
    n = x.shape[0]
    i = jnp.arange(1, n + 1, dtype=x.dtype)
    return n - jnp.sum(jnp.cos(x)) + i * (1 - jnp.cos(x)) - jnp.sin(x)


def brown_almost_linear(x):  # 27, n = 10
    n = x.shape[0]
    return jnp.concatenate([x[:-1] + jnp.sum(x) - (n + 1), jnp.stack([jnp.prod(x) - 1])])


def chebyquad(x):  # 35, n = m = 8
    n = x.shape[0]
    y = 2 * x - 1  # shifted to [-1, 1]
    t_prev, t_cur = jnp.ones_like(y), y
    rows = [jnp.mean(t_cur)]
    for _ in range(2, n + 1):
        t_prev, t_cur = t_cur, 2 * y * t_cur - t_prev
        rows.append(jnp.mean(t_cur))
    integrals = [-1.0 / (k * k - 1) if k % 2 == 0 else 0.0 for k in range(1, n + 1)]
    return jnp.stack(rows) - jnp.asarray(integrals, x.dtype)


PROBLEMS: tuple[Problem, ...] = (
    Problem("1 Rosenbrock", rosenbrock, (-1.2, 1.0), (0.0,), ("0",)),
    Problem(
        "2 Freudenstein-Roth",
        freudenstein_roth,
        (0.5, -2.0),
        (0.0, 48.98425367924),
        ("0", "48.9842"),
    ),
    Problem("3 Powell badly scaled", powell_badly_scaled, (0.0, 1.0), (0.0,), ("0",)),
    Problem("4 Brown badly scaled", brown_badly_scaled, (1.0, 1.0), (0.0,), ("0",)),
    Problem("5 Beale", beale, (1.0, 1.0), (0.0,), ("0",)),
    Problem("6 Jennrich-Sampson", jennrich_sampson, (0.3, 0.4), (124.362182355615,), ("124.362",)),
    Problem("7 Helical valley", helical_valley, (-1.0, 0.0, 0.0), (0.0,), ("0",)),
    Problem(
        "8 Bard", bard, (1.0, 1.0, 1.0), (8.21487730657897e-3, 17.4286), ("8.21487e-3", "17.4286")
    ),
    Problem("9 Gaussian", gaussian, (0.4, 1.0, 0.0), (1.12793276961896e-8,), ("1.12793e-8",)),
    Problem("10 Meyer", meyer, (0.02, 4000.0, 250.0), (87.9458551706738,), ("87.9458",)),
    Problem("11 Gulf research and development", gulf, (5.0, 2.5, 0.15), (0.0,), ("0",)),
    Problem("12 Box three-dimensional", box3d, (0.0, 10.0, 20.0), (0.0,), ("0",)),
    Problem("13 Powell singular", powell_singular, (3.0, -1.0, 0.0, 1.0), (0.0,), ("0",)),
    Problem("14 Wood", wood, (-3.0, -1.0, -3.0, -1.0), (0.0,), ("0",)),
    Problem(
        "15 Kowalik-Osborne",
        kowalik_osborne,
        (0.25, 0.39, 0.415, 0.39),
        (3.07505603849237e-4, 1.02734e-3),
        ("3.07505e-4", "1.02734e-3"),
    ),
    Problem(
        "16 Brown-Dennis", brown_dennis, (25.0, 5.0, -5.0, -1.0), (85822.2016263563,), ("85822.2",)
    ),
    Problem(
        "17 Osborne 1",
        osborne1,
        (0.5, 1.5, -1.0, 0.01, 0.02),
        (5.46489469748264e-5,),
        ("5.46489e-5",),
    ),
    Problem(
        "18 Biggs EXP6",
        biggs_exp6,
        (1.0, 2.0, 1.0, 1.0, 1.0, 1.0),
        (0.0, 5.65565e-3),
        ("0", "5.65565e-3"),
    ),
    Problem(
        "19 Osborne 2",
        osborne2,
        (1.3, 0.65, 0.65, 0.7, 0.6, 3.0, 5.0, 7.0, 2.0, 4.5, 5.5),
        (4.01377362935477e-2,),
        ("4.01377e-2",),
    ),
    Problem("20 Watson (n=6)", watson, (0.0,) * 6, (2.28767005355237e-3,), ("2.28767e-3",)),
    Problem("21 Extended Rosenbrock (n=10)", extended_rosenbrock, (-1.2, 1.0) * 5, (0.0,), ("0",)),
    Problem(
        "23 Penalty I (n=4)",
        penalty1,
        (1.0, 2.0, 3.0, 4.0),
        (2.24997750089994e-5,),
        ("2.24997e-5",),
    ),
    Problem("24 Penalty II (n=4)", penalty2, (0.5,) * 4, (9.37629300735544e-6,), ("9.37629e-6",)),
    Problem(
        "25 Variably dimensioned (n=10)",
        variably_dimensioned,
        tuple(1 - j / 10 for j in range(1, 11)),
        (0.0,),
        ("0",),
    ),
    Problem(
        "26 Trigonometric (n=10)",
        trigonometric,
        (0.1,) * 10,
        (0.0, 2.79505612187905e-5),
        ("0", "2.79506e-5"),
    ),
    Problem(
        "27 Brown almost-linear (n=10)", brown_almost_linear, (0.5,) * 10, (0.0, 1.0), ("0", "1")
    ),
    Problem(
        "35 Chebyquad (n=8)",
        chebyquad,
        tuple(j / 9 for j in range(1, 9)),
        (3.51687372567793e-3,),
        ("3.51687e-3",),
    ),
)
