"""The include graph of csrc/core, folder by folder (docs/architecture.md, "The picture"; issue 33 item 1).

Parses every `#include "..."` under csrc/core (no build needed), resolves it against the including file's folder,
and checks the folder graph (a folder = a directory relative to csrc/core, e.g. `formats/mxfp8`):
- no cycle between folders (a folder including one that includes it back, directly or around a longer loop);
- `comm/` never reaches `gemm/` (the transports and partial sums stand on `rules/` alone);
- `formats/*` never reaches `producers/` (an emitter knows its format, not who produces the values);
- nothing under csrc/core includes torch or XLA headers (the core is torch-free; both frontends link it).
"""
import re
from pathlib import Path

from tests.test_import_graph import find_cycle  # the one cycle finder of the tests (DFS, names the cycle)

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "csrc" / "core"
SUFFIXES = {".h", ".cuh", ".cu", ".cpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
FRONTEND_HEADERS = re.compile(r"^(torch/|ATen/|c10/|pybind11/|xla/|jaxlib/|Python\.h)")


def _sources():
    return sorted(p for p in CORE.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def _folder(path):
    return str(path.parent.relative_to(CORE))


def _edges():
    """{folder: {folder it includes}} and the includes that leave csrc/core or name a missing file."""
    graph, unresolved = {}, []
    for src in _sources():
        graph.setdefault(_folder(src), set())
        for kind, name in INCLUDE.findall(src.read_text()):
            if kind != '"':
                continue
            target = (src.parent / name).resolve()
            if not target.is_file():
                # Quoted includes of external libraries (CUTLASS, CuTe) are found on the include path, not here.
                if not name.startswith(("cutlass/", "cute/")):
                    unresolved.append(f"{src.relative_to(REPO)}: {name}")
                continue
            if CORE not in target.parents:
                unresolved.append(f"{src.relative_to(REPO)}: {name} (outside csrc/core)")
                continue
            dst = _folder(target)
            if dst != _folder(src):
                graph[_folder(src)].add(dst)
    return graph, unresolved


def _reach(graph, start):
    seen, stack = set(), [start]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_includes_resolve_inside_core():
    _, unresolved = _edges()
    assert not unresolved, f"quoted includes that name no file of csrc/core: {unresolved}"


def test_no_folder_cycle():
    graph, _ = _edges()
    assert {"rules", "producers", "comm", "gemm", "ops"} <= set(graph), f"unexpected csrc/core layout: {sorted(graph)}"
    assert any(edge for edge in graph.values()), "no include between folders was found: the parser is broken"
    cycle = find_cycle(graph)
    assert cycle is None, "folder-level include cycle in csrc/core: " + " -> ".join(cycle)


def test_cycle_finder_names_a_cycle():
    # The checker itself: a planted loop is found and named, a chain is not.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_comm_does_not_reach_gemm():
    graph, _ = _edges()
    reached = _reach(graph, "comm")
    assert not {f for f in reached if f == "gemm" or f.startswith("gemm/")}, f"comm/ reaches {sorted(reached)}"


def test_rules_is_the_bottom_layer():
    graph, _ = _edges()
    assert _reach(graph, "rules") <= {"rules"}, f"rules/ includes {sorted(_reach(graph, 'rules'))}"


def test_formats_do_not_reach_producers():
    graph, _ = _edges()
    for fmt in (f for f in graph if f == "formats" or f.startswith("formats/")):
        reached = _reach(graph, fmt)
        bad = sorted(f for f in reached if not (f == "rules" or f == "formats" or f.startswith("formats/")))
        assert not bad, f"{fmt}/ reaches {bad}: a format folder may include only rules/ and other format folders"


def test_no_frontend_headers_in_core():
    offenders = []
    for src in _sources():
        for _, name in INCLUDE.findall(src.read_text()):
            if FRONTEND_HEADERS.match(name):
                offenders.append(f"{src.relative_to(REPO)}: {name}")
    assert not offenders, f"csrc/core includes torch / XLA / Python headers: {offenders}"
