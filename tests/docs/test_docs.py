"""The documentation: every Python code block runs, and the site builds in strict mode."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_pages_found():
    names = {_page_id(p) for p in PAGES}
    assert {
        "index.md",
        "getting-started.md",
        "concepts.md",
        "catalog.md",
        "guides/training.md",
        "guides/hypergradients.md",
        "README.md",
    } <= names


def _page_id(page: Path) -> str:
    """A page's path under docs/, or README.md (the repository's front page)."""
    return page.relative_to(ROOT / "docs").as_posix() if page.parent != ROOT else page.name


@pytest.mark.parametrize("page", [p for p in PAGES if _BLOCK.search(p.read_text())], ids=_page_id)
def test_code_blocks_run(page, capsys):
    namespace: dict = {"__name__": "__docs__"}
    for block in _BLOCK.findall(page.read_text()):
        exec(compile(block, str(page), "exec"), namespace)  # our own docs


def _hooks():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.pop(0)
    return hooks


def test_catalog_lists_every_algorithm():
    from optsolve.solve_api.registry import algorithm_classes

    table = _hooks().catalog_markdown()
    for cls in algorithm_classes():
        assert f"| `{cls.__name__}` |" in table
    assert len(algorithm_classes()) >= 70


def _table_rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_defaults_table_has_a_row_for_every_algorithm():
    from optsolve.solve_api.registry import algorithm_classes

    rows = _table_rows(_hooks().defaults_markdown())
    names = [cls.__name__ for cls in algorithm_classes()]
    assert sorted(rows) == sorted(names)
    for cls in algorithm_classes():
        family, gtol, maxiters, xtol = rows[cls.__name__]
        assert family == cls.traits()["family"]
        assert (xtol == "yes") == ("xtol" in cls.traits()["extra_options"])
        if cls.traits()["roots_only"] and not cls.traits().get("scalar_only"):
            # solve's ftol on max|F| judges every root run (a bracket method: its bracket)
            assert gtol.startswith("ftol on max abs F: 1e-8 (float64)"), cls.__name__
            assert maxiters == ("scipy's own" if family == "scipy" else "200"), cls.__name__
        elif family == "scipy":
            assert gtol == maxiters == "scipy's own", cls.__name__
    assert rows["ScipyMinimize(method='Newton-CG')"][3] == "scipy's own, as a method option"
    assert rows["ScipyMinimize(method='BFGS')"][3] == "-"


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_defaults_table_is_what_the_solvers_use(dtype):
    """The table's figures are those the JAX-native solvers themselves fall back on (their
    default_gtol for x0's dtype, their default_maxiters), for every classical class and
    for an optax optimizer (which has none)."""
    import jax.numpy as jnp

    import optsolve
    from optsolve.backends.optax.backend import _make_solver
    from optsolve.solve_api.registry import algorithm_classes

    defaults = {d["name"]: d for d in _hooks().algorithm_defaults()}
    width = {"float64": "float64", "float32": "float32", "bfloat16": "16-bit floats"}[dtype]
    x0 = jnp.zeros(2, dtype)
    checked = 0
    for cls in algorithm_classes():
        if cls.traits()["family"] != "classical":
            continue
        prob = (
            optsolve.LeastSquaresProblem(lambda x, p: x, x0)
            if cls.traits()["needs_residuals"]
            else optsolve.OptimizationProblem(lambda x, p: jnp.sum(x**2), x0)
        )
        solver = cls().make_solver(prob)
        d = defaults[cls.__name__]
        assert (None if d["gtol"] is None else d["gtol"][width]) == solver.default_gtol
        assert d["maxiters"] == solver.default_maxiters
        checked += 1
    assert checked >= 7
    quadratic = optsolve.OptimizationProblem(lambda x, p: jnp.sum(x**2), x0)
    solver = _make_solver(optsolve.Adam(0.1), quadratic)
    assert defaults["Adam"]["gtol"] is None and solver.default_gtol is None
    assert defaults["Adam"]["maxiters"] is None and solver.default_maxiters is None
    lbfgs = _table_rows(_hooks().defaults_markdown())["LBFGS"]
    assert lbfgs[1] == "1e-8 (float64), 1e-5 (float32), 1e-2 (16-bit floats)"
    if dtype != "bfloat16":  # the constrained family: float32 and float64 only
        al = optsolve.AugmentedLagrangian().make_solver(quadratic)
        feasibility, optimality, _, _ = (float(v) for v in al._tolerances())
        np.testing.assert_allclose(
            defaults["AugmentedLagrangian"]["gtol"][width], (feasibility, optimality), rtol=1e-6
        )
        assert defaults["AugmentedLagrangian"]["maxiters"] == al.default_maxiters


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_site_builds_in_strict_mode(site):
    assert (site / "catalog" / "index.html").exists()


def test_api_page_has_no_builtin_docstrings_and_shows_the_defaults(site):
    page = html.unescape(re.sub(r"<[^>]+>", " ", (site / "api" / "index.html").read_text()))
    page = re.sub(r"\s+", " ", page)
    for kind in (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset):
        first_line = kind.__doc__.strip().splitlines()[0]
        assert first_line not in page, (kind.__name__, first_line)
    assert "bool(x) -> bool" not in page
    assert "Default stopping settings" in page and "xtol" in page
    for d in _hooks().algorithm_defaults():
        assert f" {d['name']} " in page, d["name"]
