"""No import cycles inside optsolve (design brief: "no import cycles anywhere").

A cycle here is a strongly connected component of more than one module in grimp's graph of
optsolve, whose edges are every ``import`` statement written in a module: at module level,
inside functions (an import moved into a function to dodge a cycle still makes one) and
under ``if TYPE_CHECKING``. Package ``__init__`` modules are nodes like any other, with the
imports they write: a package importing its submodules is no cycle by itself, but a
submodule importing a name back from a package whose ``__init__`` imports it is one. The
imports Python makes implicitly (a package before its submodules) are no edges, since
grimp does not record them: counted, every submodule a package re-exports would be cyclic.

``lint-imports`` (``make test``) also keeps the "no import cycles between siblings"
contract of pyproject.toml, which sees cycles between subpackages too (squashed).
"""

from __future__ import annotations

import itertools

import grimp

PACKAGE = "optsolve"


def _strongly_connected_components(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components of more than one module, sorted."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = lowlink[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append(
                        (other, iter(sorted(graph.find_modules_directly_imported_by(other))))
                    )
                    break
                if other in on_stack:
                    lowlink[module] = min(lowlink[module], index[other])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[module])
                if lowlink[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def _one_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the modules in order."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for other in sorted(graph.find_modules_directly_imported_by(module) & members):
                if other == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if other not in previous:
                    previous[other] = module
                    following.append(other)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    lines = [f"import cycle among {', '.join(component)}; one cycle:"]
    cycle = _one_cycle(graph, component)
    for importer, imported in itertools.pairwise(cycle):
        for detail in graph.get_import_details(importer=importer, imported=imported):
            lines.append(f"  {importer}:{detail['line_number']}  {detail['line_contents']}")
        if not graph.get_import_details(importer=importer, imported=imported):
            lines.append(f"  {importer} -> {imported}")
    return "\n".join(lines)


def _graph() -> grimp.ImportGraph:
    # cache_dir=None: nothing written into the working tree
    return grimp.build_graph(PACKAGE, include_external_packages=False, cache_dir=None)


def test_no_module_of_optsolve_is_in_an_import_cycle():
    graph = _graph()
    assert len(graph.modules) > 50, sorted(graph.modules)  # the whole package was read
    components = _strongly_connected_components(graph)
    assert not components, "\n\n".join(_describe(graph, c) for c in components)


def test_the_check_sees_a_cycle_through_an_import_inside_a_function():
    """The check itself, on grimp's graph edited in memory: options.py's old import of
    solve inside a function (solve imports options) is a cycle, named with its line."""
    graph = _graph()
    graph.add_import(
        importer="optsolve.solve_api.options",
        imported="optsolve.solve_api.solve",
        line_number=70,
        line_contents="from optsolve.solve_api.solve import solve",
    )
    components = _strongly_connected_components(graph)
    assert [
        c
        for c in components
        if {"optsolve.solve_api.options", "optsolve.solve_api.solve"} <= set(c)
    ], components
    message = "\n".join(_describe(graph, c) for c in components)
    assert "optsolve.solve_api.options:70  from optsolve.solve_api.solve import solve" in message, (
        message
    )


def test_the_check_sees_a_cycle_through_a_package_init():
    """A submodule importing a name from its package, whose ``__init__`` imports the
    submodule (here through solve), is a cycle too."""
    graph = _graph()
    graph.add_import(importer="optsolve.solve_api.pytree", imported="optsolve.solve_api")
    components = _strongly_connected_components(graph)
    assert [
        c for c in components if {"optsolve.solve_api", "optsolve.solve_api.pytree"} <= set(c)
    ], components
