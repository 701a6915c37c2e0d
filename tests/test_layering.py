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


def test_algorithms_are_pure():
    forbidden = {"lightning", "pytorch_lightning", "transformers", "safetensors", "decord", "pyarrow", "wandb",
                 "subprocess", "shutil", "tempfile"}
    bad = [f"{f.relative_to(REPO)} imports {r}" for f in files_of("algorithms") for r in imported_roots(f) & forbidden]
    assert not bad, bad
    opens = [str(f.relative_to(REPO)) for f in files_of("algorithms") if "open(" in f.read_text(encoding="utf-8")]
    assert not opens, opens


def test_only_models_import_transformers():
    bad = [f"{f.relative_to(REPO)}" for p in PACKAGES if p != "models" for f in files_of(p)
           if "transformers" in imported_roots(f)]
    assert not bad, bad


def test_models_do_not_import_lightning():
    bad = [str(f.relative_to(REPO)) for f in files_of("models") if imported_roots(f) & {"lightning", "pytorch_lightning"}]
    assert not bad, bad
