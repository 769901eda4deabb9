"""Every import of the product code points down the layers of docs/architecture.md, and the
layers are the folders of the one installed package:

    4 orchestration   asyncrl/orchestration/
    3 roles           asyncrl/actors/, asyncrl/learner/   (never each other)
    2 buffer          asyncrl/buffer/
    1 core            asyncrl/core/

Imports inside functions count too (a lazy import is still a dependency). The top-level
``actors``, ``learner``, ``buffer`` and ``configs`` of the repository are links into the
package (docs/architecture.md, "One package"): nothing imports them by those names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RANK = {"core": 1, "buffer": 2, "actors": 3, "learner": 3, "orchestration": 4}
LINKS = ("actors", "buffer", "configs", "learner")


def layer_of_module(name: str) -> str | None:
    """The layer of an imported module name; None for anything not ours."""
    parts = name.split(".")
    if parts[0] != "asyncrl":
        return None
    return parts[1] if parts[1:2] and parts[1] in RANK else "core"


def layer_of_file(path: Path) -> str:
    """The layer of a product file (a path relative to the repository): its folder under
    ``asyncrl/``; the package's own ``__init__.py`` is core (it installs the pickle guard)."""
    parts = path.parts
    assert parts[0] == "asyncrl", path
    if parts[1:] == ("__init__.py",):
        return "core"
    assert parts[1] in RANK, f"{path}: every product module lives in a layer's folder"
    return parts[1]


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
    return sorted((ROOT / "asyncrl").rglob("*.py"))


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
    assert wrong_way("buffer", "from asyncrl.actors.engine import x\n") == [
        "line 1: buffer imports asyncrl.actors.engine (actors)"
    ]
    assert wrong_way("learner", "def f():\n    import asyncrl.actors.rewards\n") == [
        "line 2: learner imports asyncrl.actors.rewards (actors)"
    ]
    assert wrong_way("core", "import asyncrl.orchestration.jobs\n") != []
    assert (
        wrong_way(
            "actors", "from asyncrl.buffer.codec import x\nfrom asyncrl.core.types import y\n"
        )
        == []
    )
    assert wrong_way("orchestration", "import asyncrl.learner.main, asyncrl.actors.main\n") == []


def test_the_layers_are_folders_and_the_top_level_names_link_into_the_package():
    assert sorted(
        p.name for p in (ROOT / "asyncrl").iterdir() if p.is_dir() and p.name != "__pycache__"
    ) == sorted([*RANK, "configs"])
    assert [p.name for p in (ROOT / "asyncrl").glob("*.py")] == ["__init__.py"]
    for name in LINKS:
        link = ROOT / name
        assert link.is_symlink() and link.resolve() == (ROOT / "asyncrl" / name).resolve(), name


def test_nothing_imports_the_top_level_links():
    """``import learner`` would load a second copy of ``asyncrl.learner`` from the link."""
    bad = []
    for folder in ("asyncrl", "tests", "benchmarks", "scripts", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                else:
                    continue
                rel = path.relative_to(ROOT)
                bad += [
                    f"{rel}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in LINKS
                ]
    assert not bad, "import these as asyncrl.<name>:\n" + "\n".join(bad)
