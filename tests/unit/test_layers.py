"""Every import of the product code points down the layers of docs/architecture.md, and the
layers are the folders of the one installed package:

    4 orchestration   asyncrl/orchestration/
    3 roles           asyncrl/actors/, asyncrl/learner/   (never each other)
    2 buffer          asyncrl/buffer/
    1 core            asyncrl/core/

Inside a layer the rooms (its sub-folders, and ``.`` for the modules directly in it) are
ordered the same way (``SUB``): a module imports only rooms below its own, or its own room.
Rooms of equal rank never import each other. A layer's ``__init__.py`` is its facade and may
import any of its rooms.

Imports inside functions count too (a lazy import is still a dependency). The top-level
``actors``, ``learner``, ``buffer`` and ``configs`` of the repository are links into the
package (docs/architecture.md, "One package"): nothing imports them by those names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RANK = {"core": 1, "buffer": 2, "actors": 3, "learner": 3, "orchestration": 4}
LINKS = ("actors", "buffer", "configs", "learner")
# the rooms of each layer, by rank (docs/architecture.md's map)
SUB = {
    "core": {".": 0, "config": 1, "runtime": 2, "observe": 3, "net": 3, "weights": 3},
    "buffer": {".": 0, "service": 1},
    "learner": {"algo": 1, "lora": 1, "compute": 2, "state": 3, "weights": 3, "hub": 4, ".": 5},
    "actors": {
        "data": 1,
        "engine": 1,
        "episodes": 1,
        "rewards": 1,
        "weights": 1,
        "agents": 2,
        ".": 3,
    },
    "orchestration": {
        "models": 1,
        "demo": 1,
        "slurm": 1,
        "kubernetes": 1,
        "placement": 2,
        "launch": 3,
        "evaluate": 4,
        ".": 5,
    },
}
MAX_MODULES = 15  # a folder a reader can hold


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


def room_of(parts: list[str] | tuple[str, ...]) -> str:
    """The room of ``asyncrl.<layer>.<...>`` given as parts: the sub-folder after the layer,
    or ``.`` for a module directly in the layer (or the layer itself)."""
    folder = parts[2] if len(parts) > 2 else None
    layer_dir = ROOT / "asyncrl" / parts[1]
    return folder if folder and (layer_dir / folder).is_dir() else "."


def wrong_room(layer: str, room: str, source: str) -> list[str]:
    """The imports of ``source`` (in ``room`` of ``layer``) that point up or sideways inside the
    layer."""
    bad = []
    for line, module in imported(source):
        parts = module.split(".")
        if layer_of_module(module) != layer or len(parts) < 2 or parts[1] != layer:
            continue
        target = room_of(parts)
        if target != room and SUB[layer][target] >= SUB[layer][room]:
            bad.append(f"line {line}: {layer}/{room} imports {module} ({layer}/{target})")
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


def test_every_import_inside_a_layer_points_down_its_rooms():
    bad = []
    for path in product_files():
        rel = path.relative_to(ROOT)
        layer = layer_of_file(rel)
        if rel.parts[1:] == ("__init__.py",) or rel.parts[2:] == ("__init__.py",):
            continue  # the package's and each layer's facade
        room = rel.parts[2] if len(rel.parts) > 3 else "."
        assert room in SUB[layer], f"{rel}: a room not in SUB[{layer!r}]; place it there"
        bad += [f"{rel} {b}" for b in wrong_room(layer, room, path.read_text())]
    assert not bad, "imports against the rooms (docs/architecture.md, the map):\n" + "\n".join(bad)


def test_the_room_check_sees_an_upward_and_a_sideways_import():
    assert wrong_room("learner", "algo", "from asyncrl.learner.compute.step import x\n") == [
        "line 1: learner/algo imports asyncrl.learner.compute.step (learner/compute)"
    ]
    assert wrong_room("learner", "state", "import asyncrl.learner.weights.publisher\n") != []
    assert wrong_room("learner", "compute", "from asyncrl.learner.trainer import x\n") != []
    assert wrong_room("learner", ".", "from asyncrl.learner.hub.feed import x\n") == []
    assert wrong_room("learner", "hub", "from asyncrl.core.config.job import x\n") == []


def test_every_folder_holds_few_enough_modules_to_read():
    counts = {}
    for path in product_files():
        counts.setdefault(path.parent.relative_to(ROOT), []).append(path.name)
    big = {str(d): len(names) for d, names in counts.items() if len(names) > MAX_MODULES}
    assert not big, f"folders over {MAX_MODULES} modules: split them by concern: {big}"


def test_the_check_sees_an_upward_a_sideways_and_a_lazy_import():
    """So the test above would notice: each kind of wrong import is reported, a downward one
    is not."""
    assert wrong_way("buffer", "from asyncrl.actors.engine.vllm_engine import x\n") == [
        "line 1: buffer imports asyncrl.actors.engine.vllm_engine (actors)"
    ]
    assert wrong_way("learner", "def f():\n    import asyncrl.actors.rewards\n") == [
        "line 2: learner imports asyncrl.actors.rewards (actors)"
    ]
    assert wrong_way("core", "import asyncrl.orchestration.launch.jobs\n") != []
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
