"""Every import of the product code points down the layers of docs/architecture.md:

    4 orchestration   asyncrl/orchestration/
    3 roles           actors/, learner/   (never each other)
    2 buffer          buffer/
    1 core            asyncrl/*.py, asyncrl/transports/

Imports inside functions count too (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RANK = {"core": 1, "buffer": 2, "actors": 3, "learner": 3, "orchestration": 4}


def layer_of_module(name: str) -> str | None:
    """The layer of an imported module name; None for anything not ours."""
    parts = name.split(".")
    if parts[0] == "asyncrl":
        return "orchestration" if parts[1:2] == ["orchestration"] else "core"
    return parts[0] if parts[0] in RANK else None


def layer_of_file(path: Path) -> str:
    """The layer of a product file (a path relative to the repository)."""
    parts = path.parts
    if parts[0] == "asyncrl":
        return "orchestration" if parts[1:2] == ("orchestration",) else "core"
    return parts[0]


def imported(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"line {node.lineno}: a relative import; write it absolute"
            out.append((node.lineno, node.module or ""))
    return out


def wrong_way(src_layer: str, source: str) -> list[str]:
    """The imports of ``source`` (in ``src_layer``) that point up, or across the roles."""
    bad = []
    for line, module in imported(source):
        target = layer_of_module(module)
        if target is None or target == src_layer:
            continue
        if RANK[target] >= RANK[src_layer]:
            bad.append(f"line {line}: {src_layer} imports {module} ({target})")
    return bad


def product_files() -> list[Path]:
    return [p for d in ("asyncrl", "buffer", "actors", "learner") for p in (ROOT / d).rglob("*.py")]


def test_every_import_of_the_product_code_points_down():
    files = product_files()
    assert len(files) > 100, "the product code was not found"
    bad = []
    for path in files:
        rel = path.relative_to(ROOT)
        bad += [f"{rel} {b}" for b in wrong_way(layer_of_file(rel), path.read_text())]
    assert not bad, "imports against the layers (docs/architecture.md, Code layers):\n" + "\n".join(
        bad
    )


def test_the_check_sees_an_upward_a_sideways_and_a_lazy_import():
    """So the test above would notice: each kind of wrong import is reported, a downward one
    is not."""
    assert wrong_way("buffer", "from actors.engine import x\n") == [
        "line 1: buffer imports actors.engine (actors)"
    ]
    assert wrong_way("learner", "def f():\n    import actors.rewards\n") == [
        "line 2: learner imports actors.rewards (actors)"
    ]
    assert wrong_way("core", "import asyncrl.orchestration.jobs\n") != []
    assert wrong_way("actors", "from buffer.codec import x\nfrom asyncrl.types import y\n") == []
    assert wrong_way("orchestration", "import learner.main, actors.main\n") == []
