"""The documentation: every Python code block runs, and the site builds in strict mode."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md"))
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_pages_found():
    names = {p.relative_to(ROOT / "docs").as_posix() for p in PAGES}
    assert {"index.md", "getting-started.md", "concepts.md", "catalog.md",
            "guides/training.md", "guides/hypergradients.md"} <= names


@pytest.mark.parametrize("page", [p for p in PAGES if _BLOCK.search(p.read_text())],
                         ids=lambda p: p.relative_to(ROOT / "docs").as_posix())
def test_code_blocks_run(page, capsys):
    namespace: dict = {"__name__": "__docs__"}
    for block in _BLOCK.findall(page.read_text()):
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102 - our own docs


def test_catalog_lists_every_algorithm():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from hooks import catalog_markdown
    finally:
        sys.path.pop(0)
    from optsolve.solve_api.registry import algorithm_classes
    table = catalog_markdown()
    for cls in algorithm_classes():
        assert f"| `{cls.__name__}` |" in table
    assert len(algorithm_classes()) >= 70


def test_site_builds_in_strict_mode(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                             str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                            env=env, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "catalog" / "index.html").exists()
