"""progress=True: a tqdm bar driven from inside the compiled loop, and from the training loop."""

import jax.numpy as jnp
import numpy as np

import optsolve
from optsolve import OptimizationProblem, solve


def test_progress_bar_reaches_maxiters(capsys):
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - 1.0) ** 2), jnp.zeros(3))
    sol = solve(prob, optsolve.Adam(0.01), maxiters=500, progress=True)
    err = capsys.readouterr().err
    assert "500/500" in err and "loss=" in err and "grad_norm=" in err
    assert int(sol.stats.iterations) == 500


def test_progress_bar_when_training_on_data(capsys):
    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(8, 2)),) for _ in range(10)]
    prob = OptimizationProblem(lambda w, p, b: jnp.mean((b[0] @ w - 1.0) ** 2), jnp.zeros(2))
    solve(prob, optsolve.SGD(0.1), data=data, maxiters=10, progress=True)
    assert "10/10" in capsys.readouterr().err
