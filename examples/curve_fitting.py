"""Curve fitting: an allometric power law for iris petals, with a 95% confidence band.

Fisher's iris data (150 flowers, shipped with scikit-learn) relate petal width to petal
length across three species by a power law, ``width = a * length**b``. ``optsolve.curve_fit``
fits it (Levenberg-Marquardt, the Jacobian from JAX), ``pcov`` gives the parameters' standard
errors, and the delta method turns ``pcov`` into a confidence band for the fitted curve: at
each length t, the half-width is ``1.96 * sqrt(g(t)^T pcov g(t))`` with ``g = d model /
d params`` from ``jax.jacfwd``. The fit and the standard errors are checked against
``scipy.optimize.curve_fit``. Writes ``curve_fitting.png``.

Run: ``python examples/curve_fitting.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
from sklearn.datasets import load_iris

import optsolve
from _common import pyplot, run_cli, save_figure

jax.config.update("jax_enable_x64", True)


def power_law(length, a, b):
    return a * length**b


def petals():
    """(petal length, petal width, species index, species names) of the 150 flowers, in cm."""
    iris = load_iris()
    columns = list(iris.feature_names)
    length = iris.data[:, columns.index("petal length (cm)")]
    width = iris.data[:, columns.index("petal width (cm)")]
    return length, width, iris.target, list(iris.target_names)


def confidence_band(t, popt, pcov, z: float = 1.96):
    """The fitted curve at ``t`` and the half-width of its pointwise band, by the delta
    method: ``z * sqrt(g^T pcov g)`` with ``g`` the model's gradient in the parameters."""
    curve = lambda params: power_law(t, *params)
    g = jax.jacfwd(curve)(popt)  # (len(t), 2): one gradient per point
    half_width = z * jnp.sqrt(jnp.einsum("ti,ij,tj->t", g, pcov, g))
    return curve(popt), half_width


def main(small: bool = False, out: Path = Path(".")) -> dict:
    length, width, species, names = petals()
    p0 = [0.2, 1.0]
    popt, pcov, info, _, _ = optsolve.curve_fit(
        power_law, jnp.asarray(length), jnp.asarray(width), p0, full_output=True
    )
    sol = info["solution"]
    perr = jnp.sqrt(jnp.diag(pcov))
    residual_sd = float(jnp.sqrt(2 * sol.objective / (length.size - popt.size)))
    print(
        f"{length.size} flowers, {sol.retcode}, {int(sol.stats.iterations)} iterations, "
        f"residual sd {residual_sd:.4f} cm"
    )
    for name, value, error in zip(("a", "b"), popt, perr):
        print(f"  {name} = {float(value):.6f} +- {float(error):.6f}")

    # the same fit by scipy, with method="trf": its pcov comes from the Jacobian at the
    # solution, as optsolve's does (scipy's default "lm" takes it from MINPACK's last
    # factorised Jacobian, at an earlier iterate: its standard errors differ by 4e-5 here)
    scipy_popt, scipy_pcov = scipy.optimize.curve_fit(
        lambda t, a, b: a * t**b, length, width, p0=p0, method="trf"
    )
    scipy_perr = np.sqrt(np.diag(scipy_pcov))
    params_rel = float(np.max(np.abs(np.asarray(popt) / scipy_popt - 1)))
    errors_rel = float(np.max(np.abs(np.asarray(perr) / scipy_perr - 1)))
    print(
        f"scipy.optimize.curve_fit: a = {scipy_popt[0]:.6f} +- {scipy_perr[0]:.6f}, "
        f"b = {scipy_popt[1]:.6f} +- {scipy_perr[1]:.6f}"
    )
    print(
        f"  largest relative difference: parameters {params_rel:.1e}, "
        f"standard errors {errors_rel:.1e}"
    )

    t = jnp.linspace(0.9, 7.0, 60 if small else 400)
    curve, half_width = confidence_band(t, popt, pcov)
    at = float(np.median(length))
    mid, mid_half = confidence_band(jnp.array([at]), popt, pcov)
    print(
        f"at the median length {at:.2f} cm: width {float(mid[0]):.4f} "
        f"+- {float(mid_half[0]):.4f} cm (95%)"
    )

    plt = pyplot()
    fig, (ax, res) = plt.subplots(1, 2, figsize=(11, 4.5))
    for k, name in enumerate(names):
        chosen = species == k
        ax.scatter(length[chosen], width[chosen], s=14, alpha=0.7, label=name)
        res.scatter(
            length[chosen],
            width[chosen] - np.asarray(power_law(length[chosen], *popt)),
            s=14,
            alpha=0.7,
            label=name,
        )
    ax.plot(
        t,
        curve,
        "k-",
        lw=1.5,
        label=f"width = {float(popt[0]):.3f} length$^{{{float(popt[1]):.3f}}}$",
    )
    ax.fill_between(
        t,
        curve - half_width,
        curve + half_width,
        color="k",
        alpha=0.25,
        label="95% confidence band (delta method)",
    )
    ax.set(
        xlabel="petal length (cm)",
        ylabel="petal width (cm)",
        title="Iris petals: a power law fitted by optsolve.curve_fit",
    )
    ax.legend(fontsize=8)
    res.axhline(0.0, color="k", lw=1)
    res.set(xlabel="petal length (cm)", ylabel="residual (cm)", title="Residuals")
    path = save_figure(fig, out, "curve_fitting.png")
    return {
        "params": np.asarray(popt),
        "stderr": np.asarray(perr),
        "pcov": np.asarray(pcov),
        "retcode": sol.retcode.name,
        "residual_sd": residual_sd,
        "scipy_params": scipy_popt,
        "scipy_stderr": scipy_perr,
        "max_relative_difference_params": params_rel,
        "max_relative_difference_stderr": errors_rel,
        "band": {
            "t": np.asarray(t),
            "curve": np.asarray(curve),
            "half_width": np.asarray(half_width),
        },
        "plot": path,
    }


if __name__ == "__main__":
    run_cli(main, __doc__)
