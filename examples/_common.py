"""What every example shares: its command line and saving its figure."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def run_cli(main: Callable[..., dict], doc: str) -> None:
    """``python examples/NAME.py [--small] [--out DIR]``: run ``main(small, out)``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick, small run (as in the tests)")
    parser.add_argument("--out", type=Path, default=Path("."), help="where to write the plot")
    args = parser.parse_args()
    main(args.small, args.out)


def save_figure(fig, out: Path, name: str) -> str:
    """Save ``fig`` as ``out/name``, close it, say where, and return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(out) / name
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")
    return str(path)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
