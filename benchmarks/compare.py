"""A/B: run the benchmarks against an older revision of optsolve on the same machine, in one run.

Usage: ``python benchmarks/compare.py REV [name ...] [--rounds N] [--report PATH] [--keep DIR]``.

The benchmark scripts of the working tree run twice per round, once importing optsolve from
the working tree and once from ``git archive REV src`` (through PYTHONPATH), in alternating
order, each in a fresh process. Each reported ratio (optsolve or a peer over its reference,
as in docs/benchmarks.md) is the median over the rounds; the table gives both sides and
current / REV, so a code regression is told apart from a machine that is slower today (both
sides move together). Integer cells (iterations, evaluation counts) are compared too: any
row whose counts differ between the sides is listed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from run import BENCHMARKS, ratio_cells, table_rows  # noqa: E402


def labelled_rows(markdown: str):
    """(label, header, cells) for every table row; rows sharing a first cell (one problem,
    several methods) are told apart by their position, "(row k)", whatever cells they hold,
    so that the same label names the same row on both sides."""
    seen: dict[str, int] = {}
    for header, cells in table_rows(markdown):
        seen[cells[0]] = seen.get(cells[0], 0) + 1
        k = seen[cells[0]]
        yield (cells[0] if k == 1 else f"{cells[0]} (row {k})"), header, cells


def row_counts(header: list[str], cells: list[str]) -> tuple[str, ...]:
    """A row's integer cells (iterations, evaluations, or several as "nfev/njev/nit"), each
    named by its column."""
    return tuple(
        f"{name}={cell}"
        for name, cell in zip(header[1:], cells[1:])
        if re.fullmatch(r"[0-9]+(/([0-9]+|-))*", cell)
    )


def by_heading(markdown: str) -> list[tuple[str, str]]:
    """(heading, text) for each part of a section under a markdown heading, so that rows with
    the same runner in different tables (one per problem) keep apart."""
    parts, heading, text = [], "", []
    for line in markdown.splitlines():
        if line.startswith("#"):
            parts.append((heading, "\n".join(text)))
            heading, text = line.lstrip("# ").strip(), []
        else:
            text.append(line)
    parts.append((heading, "\n".join(text)))
    return parts


def export_source(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` unpacked under ``into``; returns the directory to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_section(name: str, source: Path) -> str:
    """One benchmark's markdown section, run in a fresh process that imports optsolve from
    ``source``; fails loudly if that process imported optsolve from anywhere else."""
    env = dict(os.environ, PYTHONPATH=str(source))
    where = subprocess.run(
        [sys.executable, "-c", "import optsolve; print(optsolve.__file__)"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(source.resolve()):
        raise RuntimeError(f"PYTHONPATH={source} imported optsolve from {where}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "section.md"
        subprocess.run(
            [sys.executable, str(HERE / "run.py"), "--one", name, str(out)], env=env, check=True
        )
        return out.read_text()


def compare(rev: str, names: list[str], rounds: int, keep: Path | None = None) -> str:
    """The A/B report as markdown (see the module docstring); with ``keep``, every run's
    section is also written there (``NAME-SIDE-ROUND.md``), absolute times included."""
    current = ROOT / "src"
    lines = [
        f"# A/B: working tree against {rev}",
        f"Each ratio is the median of {rounds} round(s); in each round both sides run in "
        "fresh processes, in alternating order. `current / old` above 1 is slower now.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"old": export_source(rev, Path(tmp)), "current": current}
        for name in names:
            ratios = {"old": {}, "current": {}}
            counts = {"old": {}, "current": {}}
            failed = None
            for r in range(rounds):
                order = ("old", "current") if r % 2 == 0 else ("current", "old")
                for side in order:
                    print(f"{name}: round {r + 1}/{rounds}, {side}", flush=True)
                    try:
                        section = run_section(name, sides[side])
                    except subprocess.CalledProcessError:
                        # e.g. a benchmark that uses an API the old side lacks: the other
                        # sections are still reported
                        failed = side
                        break
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                        (keep / f"{name}-{side}-{r + 1}.md").write_text(section)
                    for heading, part in by_heading(section):
                        for row, header, cells in labelled_rows(part):
                            for what, value in ratio_cells(header, cells, keep_unity=True):
                                ratios[side].setdefault(f"{heading} / {row}: {what}", []).append(
                                    value
                                )
                            if row_counts(header, cells):
                                counts[side][f"{heading} / {row}"] = row_counts(header, cells)
                if failed:
                    break
            if failed:
                lines += [
                    f"## {name}",
                    "",
                    f"The benchmark failed on the {failed} side (its "
                    "error is above in the output); not compared.",
                    "",
                ]
                continue
            lines += [
                f"## {name}",
                "",
                "| ratio | old | current | current / old |",
                "|---|---|---|---|",
            ]
            for label in ratios["current"]:
                if label not in ratios["old"]:
                    continue
                old = statistics.median(ratios["old"][label])
                new = statistics.median(ratios["current"][label])
                lines.append(f"| {label} | {old:.3f}x | {new:.3f}x | {new / old:.3f} |")
            differing = [
                row
                for row in counts["current"]
                if row in counts["old"] and counts["current"][row] != counts["old"][row]
            ]
            lines.append("")
            lines.append(
                "Counts identical on both sides."
                if not differing
                else "Counts that differ: "
                + "; ".join(
                    f"{row}: old {', '.join(counts['old'][row])} / current "
                    f"{', '.join(counts['current'][row])}"
                    for row in differing
                )
            )
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision to compare against")
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (of {', '.join(BENCHMARKS)})")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--report", type=Path, help="also write the report to this file")
    parser.add_argument("--keep", type=Path, help="a folder for every run's own section")
    args = parser.parse_args()
    report = compare(args.rev, args.names or list(BENCHMARKS), args.rounds, args.keep)
    print(report)
    if args.report:
        args.report.write_text(report + "\n")


if __name__ == "__main__":
    main()
