"""The package's import layering: every import, at module level or inside a function, points
to the same or a lower layer, and no two modules import each other, however indirectly.

Layers, lowest first (README.md, "Layout"): the stock-op capture, thread state, source files
and embedded assets; backends; ops; mode, fusion, concatenation and logprobs; model; rollout;
score; verify, bench and train; cli. The library never imports tools/, examples/, tests/ or pytest.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = (  # a module's layer is that of the longest prefix that names it
    ("bi_rl._stock", 0),
    ("bi_rl._state", 0),
    ("bi_rl._where", 0),
    ("bi_rl._source", 0),
    ("bi_rl._lock", 0),
    ("bi_rl._split", 0),
    ("bi_rl._mask_window", 0),
    ("bi_rl.assets", 0),
    ("bi_rl.tasks", 0),
    ("bi_rl.backends", 1),
    ("bi_rl.ops", 2),
    ("bi_rl.logprobs", 3),
    ("bi_rl.mode", 3),
    ("bi_rl.fusion", 3),
    ("bi_rl.concat", 3),
    ("bi_rl.model", 4),
    ("bi_rl.rollout", 5),
    ("bi_rl.score", 6),
    ("bi_rl.verify", 7),
    ("bi_rl.bench", 7),
    ("bi_rl.train", 7),  # the trainer: GRPO updates, LoRA adapters, bi-train's loop
    ("bi_rl.dist", 7),  # planned: distributed runs
    ("bi_rl.cli", 9),
)
OUTSIDE = ("tools", "examples", "tests", "pytest", "conftest")


def _unit(mod: str) -> str:
    """The layer-table entry a module belongs to (bi_rl.backends.cuda.gemm -> bi_rl.backends)."""
    return max((p for p, _ in LAYERS if mod == p or mod.startswith(p + ".")), key=len, default=mod)


def _layer(mod: str) -> int | None:
    return dict(LAYERS).get(_unit(mod))


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "bi_rl").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(mod: str, path: Path, known: set[str]):
    """(imported module, line) for every import statement anywhere in the file."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield (sub if sub in known else base), node.lineno


def _graph():
    mods = _modules()
    return mods, {m: list(_imports(m, p, set(mods))) for m, p in mods.items()}


def test_imports_only_point_down_and_stay_in_the_library():
    mods, graph = _graph()
    bad = []
    for mod, targets in graph.items():
        here = _layer(mod)
        for target, line in targets:
            where = f"{mods[mod].relative_to(ROOT)}:{line}"
            if target.split(".")[0] in OUTSIDE:
                bad.append(f"{where}: the library imports {target}")
            elif here is not None and (_layer(target) or 0) > here:
                bad.append(f"{where}: {mod} (layer {here}) imports {target} ({_layer(target)})")
    assert not bad, "\n".join(bad)


def test_every_module_has_a_layer():
    mods, _ = _graph()
    assert [m for m in mods if m != "bi_rl" and _layer(m) is None] == []


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(m, path):
        state[m] = 1
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t) :] + [t]
            if t not in state:
                found = visit(t, [*path, t])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_no_import_cycle_between_modules():
    mods, graph = _graph()
    edges = {m: {t for t, _ in ts if t in mods and t != m} for m, ts in graph.items()}
    cycle = _find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_between_parts():
    """Parts are the entries of the layer table: bi_rl._source must not import
    bi_rl.backends while a backend imports bi_rl._source, even through different modules."""
    mods, graph = _graph()
    edges: dict[str, set[str]] = {}
    for m, ts in graph.items():
        for t, _ in ts:
            if t.startswith("bi_rl.") and _unit(t) != _unit(m):
                edges.setdefault(_unit(m), set()).add(_unit(t))
    cycle = _find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
