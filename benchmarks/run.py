"""Run every benchmark side by side with its peers and write docs/benchmarks.md.

Usage: ``python benchmarks/run.py [name ...]`` (names: optax, classical, scipy, hypergradient,
training, least_squares, models, overhead, vmap, program_size, cutest, data_compiled, first_result,
model_leaves, vectorised_de, multistart, interrupt, roots, constrained, constrained_vmap,
constrained_large, suite); ``make bench`` runs them all and writes the page anew; a list of names
replaces only their own sections. Each benchmark runs in a fresh Python process, so none inherits
another's compiled executables, threads or memory. BLAS is pinned to one thread (threadpoolctl):
OpenBLAS's default threads stall small BLAS calls on 2-core VMs (see shared/PEERS.md); JAX's own
threads are left alone.
"""

from __future__ import annotations

import datetime
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from threadpoolctl import threadpool_limits

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from common import machine_line  # noqa: E402

BENCHMARKS = {
    "optax": "bench_optax",
    "classical": "bench_classical",
    "scipy": "bench_scipy",
    "hypergradient": "bench_hypergradient",
    "training": "bench_training",
    "least_squares": "bench_least_squares",
    "models": "bench_models",
    "overhead": "bench_overhead",
    "vmap": "bench_vmap",
    "program_size": "program_size",
    "cutest": "bench_cutest",
    "data_compiled": "bench_data_compiled",
    "first_result": "bench_first_result",
    "model_leaves": "bench_model_leaves",
    "vectorised_de": "bench_vectorised_de",
    "multistart": "bench_multistart",
    "interrupt": "bench_interrupt",
    "roots": "bench_roots",
    "constrained": "bench_constrained",
    "constrained_vmap": "bench_constrained_vmap",
    "constrained_large": "bench_constrained_large",
    "suite": "bench_suite",
}


def table_rows(markdown: str):
    """(header cells, row cells) for every data row of every markdown table."""
    header = None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            yield header, cells


def ratio_cells(
    header: list[str], cells: list[str], keep_unity: bool = False
) -> list[tuple[str, float]]:
    """(column, ratio) for every cell of one row like '1.04x' in a column whose header says
    ratio or '/'; a reference's own 1.00x is left out unless ``keep_unity``."""
    found = []
    for i, (name, cell) in enumerate(zip(header, cells)):
        match = re.fullmatch(r"\*{0,2}([0-9.]+)x\*{0,2}", cell)
        if (
            match
            and ("ratio" in name.lower() or "/" in name)
            and (keep_unity or float(match.group(1)) != 1.0)
        ):
            # a bare "ratio" column qualifies the column before it
            what = header[i - 1] if name.lower() == "ratio" and i > 0 else name
            found.append((what, float(match.group(1))))
    return found


def ratios_from_tables(markdown: str) -> list[tuple[str, float]]:
    """(label, ratio) for every ratio cell (:func:`ratio_cells`) of every table row."""
    return [
        (f"{cells[0]}: {what}", value)
        for header, cells in table_rows(markdown)
        for what, value in ratio_cells(header, cells)
    ]


def plot_ratios(ratios: list[tuple[str, float]], path: Path) -> None:
    """A bar per measured ratio (optsolve or a peer against its reference), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not ratios:
        return
    labels = [label if len(label) < 90 else label[:87] + "..." for label, _ in ratios]
    values = [value for _, value in ratios]
    fig, ax = plt.subplots(figsize=(11, 0.28 * len(ratios) + 1.5))
    colors = ["C0" if "optsolve" in label.lower() else "C7" for label in labels]
    ax.barh(range(len(values)), values, color=colors)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(values)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("ratio as reported in each table (time ratio; < 1 is faster than the reference)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_one(name: str, out: Path) -> None:
    """Run one benchmark in this process and write its section (table and notes) to ``out``."""
    module = importlib.import_module(BENCHMARKS[name])
    with threadpool_limits(limits=1):
        section = module.main()
    if isinstance(section, tuple):
        section = section[0]
    if getattr(module, "NOTES", None):
        section = section + "\n\n" + module.NOTES
    out.write_text(section)


def marked(name: str, section: str) -> str:
    """``section`` between the markers that let a later run replace it alone."""
    return f"<!-- bench:{name} -->\n{section.strip()}\n<!-- /bench:{name} -->"


def with_sections(page: str, sections: dict[str, str]) -> str:
    """``page`` with each named section replaced between its markers, or, where the page has
    none for it, added before the plot of ratios (or at the end)."""
    plot = "![measured ratios](images/benchmarks.png)"
    for name, section in sections.items():
        pattern = re.compile(
            rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL
        )
        new = marked(name, section)
        if pattern.search(page):
            page = pattern.sub(lambda _: new, page)  # noqa: B023  (called by this sub)
        elif plot in page:
            page = page.replace(plot, new + "\n\n" + plot)
        else:
            page = page.rstrip() + "\n\n" + new + "\n"
    return page


def main(names: list[str]) -> None:
    sections = []
    for name in names:
        print(f"running {name} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "section.md"
            subprocess.run([sys.executable, __file__, "--one", name, str(out)], check=True)
            section = out.read_text()
        print(section, flush=True)
        sections.append(section)
    out = HERE.parent / "docs" / "benchmarks.md"
    if set(names) != set(BENCHMARKS):
        # a subset replaces its own sections of the page, the others stay as measured
        out.write_text(
            with_sections(out.read_text() if out.exists() else "", dict(zip(names, sections)))
        )
        print(f"updated {', '.join(names)} in {out}")
        return
    sections = [marked(name, section) for name, section in zip(names, sections)]
    today = datetime.date.today().isoformat()
    text = "\n\n".join(
        [
            "# Benchmarks",
            f"Measured {today} with `make bench` (`python benchmarks/run.py`) on: "
            f"{machine_line()}.",
            "Every table comes from one run in which optsolve and its peers were measured side by "
            "side; compare ratios, not absolute times (these shared machines move up to 2x between "
            "runs). BLAS pinned to one thread with threadpoolctl.",
            *sections,
        ]
    )
    plot = HERE.parent / "docs" / "images" / "benchmarks.png"
    plot_ratios([r for section in sections for r in ratios_from_tables(section)], plot)
    text += "\n\n![measured ratios](images/benchmarks.png)\n"
    out.write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        run_one(sys.argv[2], Path(sys.argv[3]))
        sys.exit(0)
    main(sys.argv[1:] or [n for n in BENCHMARKS if (HERE / f"{BENCHMARKS[n]}.py").exists()])
