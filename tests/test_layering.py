"""DESIGN §2: imports point one way — algorithms → models → datamodules / lightning_modules / callbacks → entry
points; ``algorithms/`` is pure (no lightning, no transformers, no file I/O modules) and ``models/`` is the only
package that imports transformers."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYER = {"algorithms": 0, "models": 1, "datamodules": 2, "lightning_modules": 2, "callbacks": 2, "train": 3,
         "evaluate": 3}
PACKAGES = ["algorithms", "models", "datamodules", "lightning_modules", "callbacks"]


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def files_of(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
    bad = []
    for f in files_of(package):
        for root in imported_roots(f):
            if root in LAYER and root != package and LAYER[root] >= LAYER[package] and not (
                    LAYER[package] == 2 and LAYER[root] == 2):
                bad.append(f"{f.relative_to(REPO)} imports {root}")
    assert not bad, bad


# what algorithms/ may import: the standard library's pure parts and torch / numpy (no file, process or network
# modules, no frameworks); anything else is a layering decision to make here, visibly
PURE_IMPORTS = {"__future__", "math", "bisect", "heapq", "re", "dataclasses", "typing", "collections", "functools",
                "itertools", "operator", "enum", "statistics", "torch", "numpy", "algorithms"}
# calls that do I/O or console output, by name or as methods (torch.load, np.save, Path.read_text, ...)
IO_CALLS = {"open", "print", "input", "load", "save", "savez", "savetxt", "loadtxt", "fromfile", "tofile", "memmap",
            "read_text", "write_text", "read_bytes", "write_bytes", "system", "popen"}


def io_calls(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in IO_CALLS:
                out.append((node.lineno, name))
    return out


def test_algorithms_are_pure():
    bad = [f"{f.relative_to(REPO)} imports {r}" for f in files_of("algorithms") for r in imported_roots(f) - PURE_IMPORTS]
    assert not bad, bad
    calls = [f"{f.relative_to(REPO)}:{line} calls {name}" for f in files_of("algorithms")
             for line, name in io_calls(ast.parse(f.read_text(encoding="utf-8")))]
    assert not calls, calls


def test_the_purity_check_catches_io():
    """The checks above flag what they exist for (so an empty list means something)."""
    src = "import json\nfrom pathlib import Path\nimport torch\nx = torch.load('a.pt')\nPath('b').write_text('')\n"
    tree = ast.parse(src)
    roots = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert roots - PURE_IMPORTS == {"json", "pathlib"}
    assert io_calls(tree) == [(4, "load"), (5, "write_text")]


def test_only_models_import_transformers():
    bad = [f"{f.relative_to(REPO)}" for p in PACKAGES if p != "models" for f in files_of(p)
           if "transformers" in imported_roots(f)]
    assert not bad, bad


def test_models_do_not_import_lightning():
    bad = [str(f.relative_to(REPO)) for f in files_of("models") if imported_roots(f) & {"lightning", "pytorch_lightning"}]
    assert not bad, bad
