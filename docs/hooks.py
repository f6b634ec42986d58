"""mkdocs hook: replace the ``<!-- catalog -->`` marker with the algorithm catalog, generated
from the capability traits of every registered algorithm class, so it is never stale."""

from __future__ import annotations


def catalog_markdown() -> str:
    import optsolve  # noqa: F401  (registers every backend)
    from optsolve.solve_api.registry import algorithm_classes

    def mark(flag: bool) -> str:
        return "yes" if flag else "-"

    header = ("| algorithm | backend | derivatives | bounds | constraints | jit | vmap | "
              "history | resume | data | implicit diff | unrolled diff |")
    rows = [header, "|" + "---|" * 12]
    for cls in algorithm_classes():
        t = cls.traits()
        derivatives = "Hessian" if t["needs_hessian"] else (
            "gradient" if t["needs_gradient"] else "none")
        resume = ("exact" if t["compiled_driver"] else "warm start") if t["resumable"] else "-"
        rows.append(
            f"| `{cls.__name__}` | {t['family']} | {derivatives} | {mark(t['takes_bounds'])} | "
            f"{mark(t['takes_constraints'])} | {mark(t['jittable'])} | {mark(t['vmappable'])} | "
            f"{mark(t['records_history'])} | {resume} | {mark(t['takes_data'])} | "
            f"yes | {mark(t['unrollable'])} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- catalog -->" in markdown:
        markdown = markdown.replace("<!-- catalog -->", catalog_markdown())
    return markdown
