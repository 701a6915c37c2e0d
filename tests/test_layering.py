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
                "itertools", "operator", "enum", "statistics", "fractions", "torch", "numpy", "algorithms"}
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


# --- the house (issue 24): two model families beside shared kernels, no import circles, thin entry points ---

FAMILIES = ("models.videollama3", "models.omni")
ENTRIES = ("train", "evaluate", "cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    mods = {module_name(f): f for p in PACKAGES for f in files_of(p)}
    mods.update({e: REPO / f"{e}.py" for e in ENTRIES if (REPO / f"{e}.py").is_file()})
    return mods


def import_graph(mods: dict[str, Path], sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth of the file (lazy imports inside functions count:
    they still close a circle at run time). ``from pkg import name`` points at ``pkg.name`` when that is a module."""
    graph = {}
    for m, f in mods.items():
        tree = ast.parse(sources[m] if sources else f.read_text(encoding="utf-8"))
        is_pkg = f.name == "__init__.py"
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module
                deps |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names}
        graph[m] = {d for d in deps if d in mods and d != m}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert circles(import_graph(project_modules())) == []


def test_the_circle_check_catches_a_registry_circle():
    """The old benchmark registry: ``base`` imported every format lazily, every format imported ``base``."""
    mods = {"datamodules.benchmarks.base": REPO / "datamodules/benchmarks/base.py",
            "datamodules.benchmarks.lvb": REPO / "datamodules/benchmarks/lvb.py",
            "datamodules.benchmarks.mlvu": REPO / "datamodules/benchmarks/mlvu.py"}
    sources = {"datamodules.benchmarks.base": "def load():\n    from . import lvb, mlvu\n",
               "datamodules.benchmarks.lvb": "from .base import LETTERS\n",
               "datamodules.benchmarks.mlvu": "from .base import LETTERS\n"}
    assert circles(import_graph(mods, sources)) == [sorted(mods)]


def test_model_families_are_separate():
    """Neither family imports the other; the shared modules (``models/*.py``: kernels, tower attention, tokenizer,
    heads, loading) import no family."""
    graph = import_graph(project_modules())
    bad = []
    for m, deps in graph.items():
        if not m.startswith("models"):
            continue
        own = next((fam for fam in FAMILIES if m == fam or m.startswith(fam + ".")), None)
        for d in deps:
            other = next((fam for fam in FAMILIES if d == fam or d.startswith(fam + ".")), None)
            if other is not None and other != own:
                bad.append(f"{m} imports {d}")
    assert not bad, bad
    assert {"models.kernels", "models.vision_attention", "models.tokenizer", "models.heads",
            "models.loading"} <= set(graph)


def test_benchmark_formats_import_base_only():
    """The registry is the table in ``datamodules/benchmarks/__init__.py``; a format module imports ``base`` (and
    the ``subtitles`` helpers), never the package or another format."""
    graph = import_graph(project_modules())
    allowed = {"datamodules.benchmarks.base", "datamodules.benchmarks.subtitles"}
    bad = [f"{m} imports {d}" for m, deps in graph.items() if m.startswith("datamodules.benchmarks.")
           and m.rsplit(".", 1)[1] not in ("base", "subtitles") for d in deps
           if d.startswith("datamodules.benchmarks") and d not in allowed]
    assert not bad, bad


# the decode room (issue 40): its file names are the pipeline, in this order; the NVDEC reader comes last
DECODE_STEPS = ("errors", "display", "probe", "plan", "readers", "cpu", "swscale", "pyav_skip", "retry", "held",
                "parts", "cpu_slots", "video", "packet_filter", "convert", "nvdec_plan", "nvdec", "isolated")


def test_decode_steps_import_one_way():
    """Each module of ``datamodules/decode/`` imports only the steps before it (the NVDEC reader also reads the
    package's registry when it registers); the package imports every step but the NVDEC reader (importing it
    imports PyNvVideoCodec and registers ``READERS["nvdec"]``: opt-in) and the isolated decode (a child process's
    entry point, imported by the dataset), and no module imports decord when it is
    imported (PyNvVideoCodec must come first in a process: ``datamodules.decode.nvdec._import_nvc``)."""
    graph = import_graph(project_modules())
    rank = {f"datamodules.decode.{s}": k for k, s in enumerate(DECODE_STEPS)}
    assert set(rank) | {"datamodules.decode"} == {m for m in graph if m.startswith("datamodules.decode")}
    bad = [f"{m} imports {d}" for m in rank for d in graph[m] if d in rank and rank[d] >= rank[m]]
    assert not bad, bad
    assert graph["datamodules.decode.nvdec"] & {"datamodules.decode"} and not any(
        "datamodules.decode" in graph[m] for m in rank if m != "datamodules.decode.nvdec")
    assert graph["datamodules.decode"] == set(rank) - {"datamodules.decode.packet_filter", "datamodules.decode.display",
                                                       "datamodules.decode.swscale", "datamodules.decode.convert",
                                                       "datamodules.decode.nvdec_plan", "datamodules.decode.nvdec",
                                                       "datamodules.decode.isolated", "datamodules.decode.cpu_slots"}
    eager = [f"{f.name} imports {a.name if isinstance(n, ast.Import) else n.module}"
             for f in sorted((REPO / "datamodules/decode").glob("*.py"))
             for n in ast.parse(f.read_text(encoding="utf-8")).body if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names
             if ((a.name if isinstance(n, ast.Import) else n.module) or "").split(".")[0]
             in ("decord", "PyNvVideoCodec")]
    assert not eager, eager


def test_entry_points_are_thin_and_independent():
    """``train.py`` and ``evaluate.py`` build their CLI from ``cli.py``; neither imports the other, and ``cli.py``
    imports neither."""
    graph = import_graph(project_modules())
    assert "cli" in graph["train"] and "cli" in graph["evaluate"]
    assert "evaluate" not in graph["train"] and "train" not in graph["evaluate"]
    assert not graph["cli"] & {"train", "evaluate"}


def test_what_a_spawned_decode_worker_imports_has_no_lightning():
    """A DataLoader worker started with ``spawn`` (NVDEC) imports the entry point as ``__mp_main__`` and the module
    of the pickled dataset: neither may pull in Lightning (seconds of start-up per worker before its first decode)."""
    import subprocess
    import sys

    code = ("import sys, runpy; runpy.run_path('evaluate.py', run_name='__mp_main__'); "
            "import datamodules.video_items; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('lightning', 'pytorch_lightning', 'lightning_fabric')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
    from datamodules import videoqa, video_items

    assert videoqa.VideoQADataset is video_items.VideoQADataset and videoqa.VideoTask is video_items.VideoTask


def test_model_files_stay_under_500_lines():
    """Issue 43 item 8: a file of ``models/`` is one concept a reader can hold (models/kernels.py had 509 lines,
    models/videollama3/answering.py 501: split into kernels + fused_forwards and answering + batched_decode)."""
    long = {str(f.relative_to(REPO)): n for f in files_of("models")
            if (n := len(f.read_text(encoding="utf-8").splitlines())) >= 500}
    assert not long, long
