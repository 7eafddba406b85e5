#!/usr/bin/env python3
"""The server crate's seams, measured: import circles between its folders, files over the
line limit, and the placement and "is there a cluster" branches outside the queue
implementations and the topology (issue 35's goals: none, none, none).

A folder is a top-level module of crates/server/src (`amqp`, `queues`, `peers`, ...; a file
directly under src is a folder of one); `lib.rs` is `crate`, where `Shared` lives. An edge
a -> b is a path `crate::b` (or `use crate::{b, ..}`) written in a file of a; lib.rs's edges
are the module paths its own items name. A circle is a strongly connected component of more
than one folder.

    scripts/server-seams.py            # the report
    scripts/server-seams.py --dot      # the folder graph for graphviz (dot -Tsvg)
"""

import argparse
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "crates" / "server" / "src"
# issue 35: "no file over ~800 lines".
FILE_LINES_MAX = 800
# Where a queue's place and the cluster's presence may be asked: the queue implementations
# and the topology.
BRANCHES_ALLOWED_UNDER = ("queues", "topology")
PLACEMENT = re.compile(
    r"\b(hosts|member_here|home_node|quorum_log|quorum_group|is_replicated|is_quorum|remote_home)\b"
)
CLUSTER_FIELD = re.compile(r"\.cluster\b")


def folder_of(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC)
    if rel.parts == ("lib.rs",):
        return "crate"
    if len(rel.parts) == 1:
        return rel.stem
    return rel.parts[0]


def strip_comments(text: str) -> str:
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def modules() -> set:
    lib = (SRC / "lib.rs").read_text()
    return set(re.findall(r"^pub mod (\w+);", lib, re.M)) | set(
        re.findall(r"^mod (\w+);", lib, re.M)
    )


def edges(mods: set) -> dict:
    graph = collections.defaultdict(set)
    for path in sorted(SRC.rglob("*.rs")):
        here = folder_of(path)
        code = strip_comments(path.read_text())
        named = set(re.findall(r"\bcrate::(\w+)", code))
        for group in re.findall(r"use crate::\{([^}]*)\}", code, re.S):
            named |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
        if here == "crate":
            named |= {m for m in re.findall(r"\b(\w+)::", code) if m in mods}
        for name in named:
            there = name if name in mods else "crate"
            if there != here:
                graph[here].add(there)
    return graph


def circles(graph: dict) -> list:
    """Tarjan's strongly connected components with more than one member."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    nodes = set(graph) | {b for bs in graph.values() for b in bs}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def branches() -> collections.Counter:
    counts = collections.Counter()
    for path in sorted(SRC.rglob("*.rs")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in BRANCHES_ALLOWED_UNDER:
            continue
        for line in strip_comments(path.read_text()).splitlines():
            if PLACEMENT.search(line) or CLUSTER_FIELD.search(line):
                counts[str(rel)] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dot", action="store_true", help="print the folder graph as dot")
    args = parser.parse_args()
    mods = modules()
    graph = edges(mods)
    if args.dot:
        print("digraph server {")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    found = circles(graph)
    print(f"folders: {len(set(graph) | {b for bs in graph.values() for b in bs})}, "
          f"edges: {sum(len(b) for b in graph.values())}")
    print(f"import circles between folders: {len(found)}")
    for c in found:
        print(f"  {len(c)} folders: {' '.join(c)}")
    # The circles the folders make among themselves, `Shared`'s own aside.
    apart = {a: bs - {"crate"} for a, bs in graph.items() if a != "crate"}
    found = circles(apart)
    print(f"  without the crate root (Shared): {len(found)}")
    for c in found:
        print(f"    {len(c)} folders: {' '.join(c)}")
    long_files = sorted(
        (len(p.read_text().splitlines()), str(p.relative_to(SRC)))
        for p in SRC.rglob("*.rs")
        if len(p.read_text().splitlines()) > FILE_LINES_MAX
    )
    print(f"files over {FILE_LINES_MAX} lines: {len(long_files)}")
    for lines, name in reversed(long_files):
        print(f"  {lines:5} {name}")
    counts = branches()
    print(
        f"placement/cluster branches outside {', '.join(BRANCHES_ALLOWED_UNDER)}: "
        f"{sum(counts.values())} lines in {len(counts)} files"
    )
    for name, n in counts.most_common():
        print(f"  {n:4} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
