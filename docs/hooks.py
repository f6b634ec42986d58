"""mkdocs hook: replace the ``<!-- catalog -->`` marker with the algorithm catalog and the
``<!-- defaults -->`` marker with every algorithm's default stopping settings, both generated
from the registered algorithm classes (their capability traits), so they are never stale.

Also a Griffe extension, :class:`NoBuiltinDocstrings` (loaded by mkdocstrings, see
mkdocs.yml), for the API reference."""

from __future__ import annotations

import builtins
import inspect
from typing import Any

from griffe import Extension


def catalog_markdown() -> str:
    import optsolve  # noqa: F401  (registers every backend)
    from optsolve.solve_api.registry import algorithm_classes

    def mark(flag: bool) -> str:
        return "yes" if flag else "-"

    header = (
        "| algorithm | backend | problem | x | derivatives | bounds | constraints | jit | "
        "vmap | history | resume | data | model state | implicit diff | unrolled diff |"
    )
    rows = [header, "|" + "---|" * 15]
    for cls in algorithm_classes():
        t = cls.traits()
        derivatives = (
            "Hessian" if t["needs_hessian"] else ("gradient" if t["needs_gradient"] else "none")
        )
        if t["roots_only"]:  # of F: its Jacobian dF/dx
            derivatives = "Jacobian" if t["needs_gradient"] else "none"
        resume = ("exact" if t["compiled_driver"] else "warm start") if t["resumable"] else "-"
        x = "scalar" if t.get("scalar_only") else "any pytree"
        bounds = "needed" if t.get("needs_bounds") else mark(t["takes_bounds"])
        rows.append(
            f"| `{cls.__name__}` | {t['family']} | {problem_kinds(t)} | {x} | {derivatives} | "
            f"{bounds} | "
            f"{mark(t['takes_constraints'])} | {mark(t['jittable'])} | {mark(t['vmappable'])} | "
            f"{mark(t['records_history'])} | {resume} | {mark(t['takes_data'])} | "
            f"{mark(t['threads_model_state'])} | yes | {mark(t['unrollable'])} |"
        )
    return "\n".join(rows)


def problem_kinds(traits: dict[str, Any]) -> str:
    """What a class solves, from its traits: "minimisation" (an OptimizationProblem),
    "least squares" (a LeastSquaresProblem), "roots" (a RootProblem; ``solves_roots``), or
    several; ``roots_only`` classes solve RootProblems alone."""
    kinds = (
        []
        if traits["roots_only"]
        else ["least squares" if traits["needs_residuals"] else "minimisation"]
    )
    if traits["solves_roots"] is not None:
        kinds.append("roots")
    return ", ".join(kinds)


# The floating-point widths default_gtol distinguishes (by item size), as the table names them.
_WIDTHS = {8: "float64", 4: "float32", 2: "16-bit floats"}


def algorithm_defaults() -> list[dict[str, Any]]:
    """What ``solve`` uses for every registered algorithm class when given no ``gtol`` and no
    ``maxiters``, and whether it takes ``solve``'s ``xtol``.

    One dict per class: ``name``, ``family``, ``gtol`` ({dtype name: tolerance}, None for
    no default test, or "scipy" for scipy's own defaults), ``maxiters`` (an int, None, or
    "scipy"), ``xtol`` (True where ``xtol`` is in the class's ``extra_options``) and
    ``scipy_xtol`` (the scipy method has an ``xtol`` option of its own); a class that solves
    RootProblems only has ``tolerance`` "ftol": its ``gtol`` is then solve's default ``ftol``
    on max|F| (the root test), by dtype.
    """
    import optsolve  # noqa: F401  (registers every backend)
    from optsolve.backends.classical.descent import DEFAULT_GTOL
    from optsolve.backends.scipy.options import valid_options
    from optsolve.solve_api.registry import algorithm_classes
    from optsolve.solve_api.roots import _DEFAULT_TOL

    out = []
    for cls in algorithm_classes():
        t = cls.traits()
        row = {
            "name": cls.__name__,
            "family": t["family"],
            "xtol": "xtol" in t["extra_options"],
            "scipy_xtol": False,
            "roots_only": t["roots_only"],
        }
        if t["roots_only"] and not t.get("scalar_only"):
            # solve judges a root run by max|F| <= ftol, its default by x's dtype (scipy's
            # nonlin methods and df-sane get it as fatol); scipy's budget is its own
            row.update(
                gtol={_WIDTHS[size]: tol for size, tol in _DEFAULT_TOL.items() if size in _WIDTHS},
                tolerance="ftol",
                maxiters="scipy" if t["family"] == "scipy" else cls.default_maxiters,
            )
            if t["family"] == "scipy":
                row.update(scipy_xtol="xatol" in cls.spec.options)
        elif t["family"] == "scipy":
            # optsolve passes no tolerance or budget of its own unless solve is given one
            # (minimize_scalar's methods list their own options: xtol, or bounded's xatol)
            own = cls.spec.options if t.get("scalar_only") else valid_options(cls.spec)
            row.update(gtol="scipy", maxiters="scipy", scipy_xtol="xtol" in own or "xatol" in own)
        elif not t["stops_by_itself"]:
            row.update(gtol=None, maxiters=None)
        elif t["family"] == "classical" and t.get("scalar_only"):
            # the interval methods stop on their bracket (their xtol / atol), not on gtol
            row.update(gtol=None, maxiters=cls.default_maxiters)
        elif t["family"] == "native":
            # a wrapper (Multistart): each run stops as its inner algorithm does
            row.update(gtol="inner", maxiters="inner")
        elif t["family"] == "constrained" and hasattr(cls, "default_tols"):
            # AugmentedLagrangian: |V| <= feasibility_tol and the projected Lagrangian
            # gradient <= optimality_tol (by x's dtype), not solve's gtol
            row.update(
                gtol={_WIDTHS[size]: tols[:2] for size, tols in cls.default_tols.items()},
                tolerance="feasibility-optimality",
                maxiters=cls.default_maxiters,
            )
        elif t["family"] == "constrained":
            # its own KKT test, E_0 <= tol (by x's dtype), not a gradient test
            row.update(
                gtol={_WIDTHS[size]: tol for size, tol in cls.default_tol.items()},
                tolerance="kkt",
                maxiters=cls.default_maxiters,
            )
        elif t["family"] == "classical":
            # the solvers' own: default_gtol(x's dtype) and the class's default_maxiters
            row.update(
                gtol={_WIDTHS[size]: tol for size, tol in DEFAULT_GTOL.items()},
                maxiters=cls.default_maxiters,
            )
        else:
            raise ValueError(
                f"docs/hooks.py: no rule for the defaults of {cls.__name__} "
                f"(family {t['family']!r}, stops by itself); add one."
            )
        out.append(row)
    return out


def _number(value: float) -> str:
    """1e-08 as "1e-8", 0.01 as "1e-2"."""
    mantissa, exponent = f"{value:.12e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def defaults_markdown() -> str:
    rows = [
        "| algorithm | family | default gtol | default maxiters | `xtol` |",
        "|---|---|---|---|---|",
    ]
    for d in algorithm_defaults():
        if d.get("tolerance") == "ftol":  # a root solver: ftol on max|F|, not gtol
            gtol = "ftol on max abs F: " + ", ".join(
                f"{_number(tol)} ({width})" for width, tol in d["gtol"].items()
            )
            maxiters = "scipy's own" if d["maxiters"] == "scipy" else str(d["maxiters"])
        elif d.get("tolerance") == "kkt":  # a constrained method: its KKT error, not gtol
            gtol = "none: KKT error E_0 <= tol, " + ", ".join(
                f"{_number(tol)} ({width})" for width, tol in d["gtol"].items()
            )
            maxiters = str(d["maxiters"])
        elif d.get("tolerance") == "feasibility-optimality":
            gtol = "none: feasibility_tol / optimality_tol, " + ", ".join(
                f"{_number(feas)} / {_number(opt)} ({width})"
                for width, (feas, opt) in d["gtol"].items()
            )
            maxiters = f"{d['maxiters']} outer"
        elif d["gtol"] == "scipy":
            gtol, maxiters = "scipy's own", "scipy's own"
        elif d["gtol"] == "inner":
            gtol = maxiters = "the inner algorithm's"
        elif d["gtol"] is None and d["maxiters"] is not None:
            tolerances = "`xtol`, `rtol`" if d.get("roots_only") else "`xtol`, `atol`"
            gtol, maxiters = f"none: the bracket's own {tolerances}", str(d["maxiters"])
        elif d["gtol"] is None:
            gtol = "none"
            maxiters = "none: give `maxiters` (or gtol, ftol, maxtime)"
        else:
            gtol = ", ".join(f"{_number(tol)} ({width})" for width, tol in d["gtol"].items())
            maxiters = str(d["maxiters"])
        xtol = (
            "yes" if d["xtol"] else ("scipy's own, as a method option" if d["scipy_xtol"] else "-")
        )
        rows.append(f"| `{d['name']}` | {d['family']} | {gtol} | {maxiters} | {xtol} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- catalog -->" in markdown:
        markdown = markdown.replace("<!-- catalog -->", catalog_markdown())
    if "<!-- defaults -->" in markdown:
        markdown = markdown.replace("<!-- defaults -->", defaults_markdown())
    return markdown


class NoBuiltinDocstrings(Extension):
    """Griffe extension: an attribute holding an instance of a builtin type (a ClassVar
    trait ``jittable = True``, a dataclass field's default ``learning_rate = 0.15``) has no
    docstring of its own, but inspection reads ``value.__doc__``, which is the type's
    ("bool(x) -> bool"); drop it, so such attributes are not rendered as documented."""

    def on_attribute_instance(self, *, node, attr, agent, **kwargs) -> None:
        value = getattr(node, "obj", None)  # an ObjectNode: dynamic analysis
        if (
            attr.docstring is None
            or type(value).__module__ != builtins.__name__
            or (inspect.isclass(value) or inspect.isroutine(value) or inspect.ismodule(value))
        ):
            return
        if getattr(value, "__doc__", None) == getattr(type(value), "__doc__", None):
            attr.docstring = None
