"""optsolve showcase: one problem, several optimizers, one table.

An L2-regularised logistic regression (synthetic data, 2000 samples x 20 features, the
regularisation strength is the hyperparameter p) is solved by optax optimizers wrapped as
optsolve algorithms, by a raw optax chain with a zoom line search (no user wrapper: solve
supplies value, grad and value_fn), and by optax.lbfgs. Run with ``make demo``: JAX's
persistent compilation cache is on, so a second run skips most of the compilation.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optsolve
from optsolve import OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)


def make_problem() -> OptimizationProblem:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2000, 20))
    true_w = rng.normal(size=20)
    labels = (features @ true_w + rng.normal(size=2000) > 0).astype(np.float64)
    a, y = jnp.asarray(features), jnp.asarray(labels)

    def loss(params, lam):
        z = a @ params["w"] + params["b"]
        return jnp.mean(jnp.logaddexp(0.0, z) - y * z) + lam * jnp.sum(params["w"] ** 2)

    x0 = {"w": jnp.zeros(20), "b": jnp.zeros(())}
    return OptimizationProblem(loss, x0, p=jnp.asarray(1e-3))


def main() -> None:
    prob = make_problem()
    runs = [
        ("optsolve.Adam(0.05)", optsolve.Adam(0.05), {}),
        ("optsolve.AdamW(0.05, weight_decay=1e-4)", optsolve.AdamW(0.05, weight_decay=1e-4), {}),
        ("optsolve.SGD(0.5, momentum=0.9)", optsolve.SGD(0.5, momentum=0.9), {}),
        ("optsolve.RMSProp(0.01)", optsolve.RMSProp(0.01), {}),
        ("optsolve.Lion(0.005)", optsolve.Lion(0.005), {}),
        (
            "optsolve.Adam(cosine schedule)",
            optsolve.Adam(optax.cosine_decay_schedule(0.1, 2000, alpha=0.01)),
            {},
        ),
        (
            "optax.chain(sgd(1), zoom line search)",
            optax.chain(optax.sgd(1.0), optax.scale_by_zoom_linesearch(max_linesearch_steps=20)),
            {},
        ),
        ("optax.lbfgs()", optax.lbfgs(), {}),
    ]
    header = (
        f"{'algorithm':42s} {'objective':>14s} {'grad inf-norm':>13s} {'iters':>6s} "
        f"{'f evals':>8s} {'g evals':>8s} {'first (s)':>10s} {'steady (s)':>10s}  retcode"
    )
    print(
        "L2-regularised logistic regression, 2000 x 20, float64; "
        "stop at gradient inf-norm <= 1e-6 or 2000 iterations\n"
    )
    print(header)
    print("-" * len(header))
    for name, algorithm, extra in runs:
        start = time.perf_counter()
        solve(prob, algorithm, maxiters=2000, gtol=1e-6, **extra)
        first = time.perf_counter() - start
        sol = solve(prob, algorithm, maxiters=2000, gtol=1e-6, **extra)
        grad = jax.grad(prob.f)(sol.x, prob.p)
        gnorm = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grad))
        print(
            f"{name:42s} {float(sol.objective):14.10f} {gnorm:13.2e} "
            f"{int(sol.stats.iterations):6d} {int(sol.stats.f_evals):8d} "
            f"{int(sol.stats.grad_evals):8d} {first:10.3f} {sol.stats.time:10.4f}  "
            f"{sol.retcode.name}"
        )

    # Hyperparameters are pytree leaves: a sweep over learning rates compiles once.
    start = time.perf_counter()
    finals = [
        float(solve(prob, optsolve.Adam(lr), maxiters=500).objective)
        for lr in (0.01, 0.02, 0.05, 0.1, 0.2)
    ]
    print(
        f"\nAdam, 5 learning rates x 500 steps, no recompilation: "
        f"{time.perf_counter() - start:.2f} s; objectives {', '.join(f'{v:.6f}' for v in finals)}"
    )


if __name__ == "__main__":
    # A second `make demo` loads the compiled loops from this cache ("first (s)" drops).
    # Here, not at import: the test suite runs main() under its own cache settings.
    print(f"compilation cache: {optsolve.enable_compilation_cache()}")
    main()
