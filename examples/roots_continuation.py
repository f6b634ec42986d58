"""A solution branch x*(p) of a nonlinear system, traced by one vmapped solve, with the
implicit derivative dx*/dp drawn as tangents.

scipy's pressure network (``test_minpack.pressure_network``): a flow ``Qtot`` splits over
four parallel pipes, the pressure drop in pipe i is ``k_i Q_i^2``, and all four drops are
equal: ``F(Q) = (k_i Q_i^2 - k_0 Q_0^2 for i = 1..3, sum(Q) - Qtot) = 0``. The valve
coefficient ``k_0`` of the first pipe is the parameter: as it opens (k_0 small) that pipe
takes most of the flow. Every solve starts at scipy's test start ``Q = (2, 0, 2, 0)``,
where the Jacobian is singular (two equal rows); ``NewtonRaphson`` takes a least-squares
step there. ``jax.vmap`` solves the whole branch as one compiled call, and
``jax.vmap(jax.jacfwd(...))`` gives ``dQ*/dk_0`` at every point by the implicit function
theorem, ``-(dF/dQ)^-1 dF/dk_0``, without differentiating the iterations. Both are checked
against the closed form ``Q_i = Qtot k_i^(-1/2) / sum_j k_j^(-1/2)`` and the derivative also
against central finite differences. Writes ``roots_continuation.png`` (the docs' figure:
``--out docs/images``).

Run: ``python examples/roots_continuation.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import optsolve
from _common import pyplot, run_cli, save_figure

jax.config.update("jax_enable_x64", True)

QTOT = 4.0
K_REST = jnp.array([1.0, 2.0, 4.0])  # the other three pipes' valve coefficients
START = jnp.array([2.0, 0.0, 2.0, 0.0])  # scipy's start: a singular Jacobian


def pressure_network(Q, k0):
    """F(Q, k0): equal pressure drops k_i Q_i^2 in the four pipes, and the flows add up."""
    k = jnp.concatenate([jnp.atleast_1d(k0), K_REST])
    P = k * Q**2
    return jnp.concatenate([P[1:] - P[0], jnp.atleast_1d(Q.sum() - QTOT)])


def closed_form(k0):
    """Q*(k0) = Qtot w / sum(w), w_i = k_i^(-1/2), and its derivative in k0."""
    k = np.concatenate([[k0], np.asarray(K_REST)])
    w = k**-0.5
    dw = np.array([-0.5 * k0**-1.5, 0.0, 0.0, 0.0])
    S = w.sum()
    return QTOT * w / S, QTOT * (dw * S - w * dw[0]) / S**2


def flows(k0):
    """The root Q*(k0), from the singular start, by Newton-Raphson."""
    return optsolve.solve(
        optsolve.RootProblem(pressure_network, START, k0), optsolve.NewtonRaphson()
    ).x


def main(small: bool = False, out: Path = Path(".")) -> dict:
    n = 40 if small else 400
    k0s = jnp.geomspace(0.05, 20.0, n)
    branch = jax.jit(jax.vmap(flows))
    Q = np.asarray(branch(k0s))  # one compiled, batched solve of the whole branch
    dQ = np.asarray(jax.jit(jax.vmap(jax.jacfwd(flows)))(k0s))  # implicit, (n, 4)
    exact, exact_dQ = (np.stack(v) for v in zip(*(closed_form(float(k)) for k in k0s)))
    h = 1e-6 * np.asarray(k0s)
    fd = (np.asarray(branch(k0s + h)) - np.asarray(branch(k0s - h))) / (2 * h[:, None])
    sol = optsolve.solve(
        optsolve.RootProblem(pressure_network, START, 1.0), optsolve.NewtonRaphson()
    )
    errors = {
        "max_flow_error": float(np.max(np.abs(Q - exact))),
        "max_derivative_vs_fd": float(np.max(np.abs(dQ - fd))),
        "max_derivative_vs_closed_form": float(np.max(np.abs(dQ - exact_dQ))),
    }
    print(
        f"{n} values of k0 in one vmapped solve: max|Q - closed form| = "
        f"{errors['max_flow_error']:.1e}; dQ/dk0 vs finite differences "
        f"{errors['max_derivative_vs_fd']:.1e}, vs the closed form "
        f"{errors['max_derivative_vs_closed_form']:.1e}"
    )
    print(
        f"k0 = 1 alone: {sol.retcode}, {sol.stats.iterations} iterations, Q = "
        f"{np.round(np.asarray(sol.x), 6)}"
    )

    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.5, 4.3))
    marks = np.linspace(0, n - 1, 9).astype(int)[1:-1]
    for i in range(4):
        label = "pipe 0: k = k0" if i == 0 else f"pipe {i}: k = {float(K_REST[i - 1]):g}"
        ax.plot(k0s, Q[:, i], color=f"C{i}", label=label)
        for j in marks:  # the implicit derivative as a tangent: dQ/d(ln k0) = k0 dQ/dk0
            k, span = float(k0s[j]), 0.45
            ks = k * np.exp(np.linspace(-span, span, 2))
            ax.plot(ks, Q[j, i] + k * dQ[j, i] * np.log(ks / k), color="k", lw=0.9)
            ax.plot([k], [Q[j, i]], "o", color=f"C{i}", ms=3.5, mec="k", mew=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("valve coefficient k0 of pipe 0")
    ax.set_ylabel("flow Q*_i (Qtot = 4)")
    ax.set_title(
        f"x*(p): {n} roots from one jax.vmap'd NewtonRaphson,\n"
        "tangents from the implicit derivative dQ*/dk0",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax2.semilogy(
        k0s,
        np.max(np.abs(dQ - fd), axis=1) + 1e-18,
        label="dQ*/dk0 vs central differences (h = 1e-6 k0)",
    )
    ax2.semilogy(
        k0s, np.max(np.abs(dQ - exact_dQ), axis=1) + 1e-18, label="dQ*/dk0 vs the closed form"
    )
    ax2.semilogy(k0s, np.max(np.abs(Q - exact), axis=1) + 1e-18, label="Q* vs the closed form")
    ax2.set_xscale("log")
    ax2.set_xlabel("k0")
    ax2.set_ylabel("max abs difference over the 4 pipes")
    ax2.set_title("the roots and their implicit derivative, checked", fontsize=9)
    ax2.legend(fontsize=8)
    plot = save_figure(fig, out, "roots_continuation.png")
    return {
        "plot": plot,
        "n": n,
        "retcode": str(sol.retcode),
        "iterations": int(sol.stats.iterations),
        **errors,
    }


if __name__ == "__main__":
    run_cli(main, __doc__)
