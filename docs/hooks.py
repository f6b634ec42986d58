"""mkdocs hook: replace the ``<!-- catalog -->`` marker with the algorithm catalog, generated
from the capability traits of every registered algorithm class, so it is never stale."""

from __future__ import annotations


def catalog_markdown() -> str:
    import optsolve  # noqa: F401  (registers every backend)
    from optsolve.solve_api.registry import algorithm_classes

    def mark(flag: bool) -> str:
        return "yes" if flag else "-"

    header = ("| algorithm | backend | derivatives | bounds | constraints | jit | vmap | "
              "implicit diff | unrolled diff |")
    rows = [header, "|" + "---|" * 9]
    for cls in algorithm_classes():
        derivatives = "Hessian" if cls.needs_hessian else ("gradient" if cls.needs_gradient else "none")
        rows.append(
            f"| `{cls.__name__}` | {cls.family} | {derivatives} | {mark(cls.takes_bounds)} | "
            f"{mark(cls.takes_constraints)} | {mark(cls.jittable)} | {mark(cls.vmappable)} | "
            f"yes | {mark(cls.unrollable)} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- catalog -->" in markdown:
        markdown = markdown.replace("<!-- catalog -->", catalog_markdown())
    return markdown
