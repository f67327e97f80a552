"""Count the import cycles of a package: groups of modules that import one another, directly or
through others (strongly connected components of the import graph, imports inside functions
included), as ``python tools/import_cycles.py [PACKAGE]`` prints them. ``make lint`` checks the
layering itself (``lint-imports``, the contracts in ``pyproject.toml``); this tool measures what
the contracts forbid, also on a tree that has none.
"""

from __future__ import annotations

import sys

import grimp


def cycles(package: str) -> list[list[str]]:
    """Every group of two or more modules of ``package`` that import one another, largest
    first (Tarjan's strongly connected components)."""
    graph = grimp.build_graph(package)
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for nxt in sorted(graph.find_modules_directly_imported_by(module)):
            if nxt not in index:
                visit(nxt)
                low[module] = min(low[module], low[nxt])
            elif nxt in on_stack:
                low[module] = min(low[module], index[nxt])
        if low[module] == index[module]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(modules) + 100))
    for module in modules:
        if module not in index:
            visit(module)
    return sorted(found, key=len, reverse=True)


def main(argv: list[str]) -> int:
    package = argv[1] if len(argv) > 1 else "gnnpipe"
    found = cycles(package)
    for i, group in enumerate(found, 1):
        print(f"cycle {i}: {len(group)} modules: {', '.join(group)}")
    print(f"{package}: {len(found)} import cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
