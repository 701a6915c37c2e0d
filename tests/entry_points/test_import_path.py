"""Issue 41 (first answer, cold): what predict does not need stays off its import path.

``cli.import_torchmetrics_lean`` imports torchmetrics (which Lightning imports for its version) with matplotlib,
scipy and torchvision reported missing, so torchmetrics' ``__init__`` does not load them (torchvision's ``ops``
import the compile stack); the plots import matplotlib only when the scores are written, and the Video-MME loader
pyarrow only when it reads its parquet.
"""
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# what the predict path must not import (sympy is not listed: Lightning's own ``lightning.fabric.wrappers`` imports
# ``torch._dynamo`` at import, and with it sympy)
KEPT_OFF = ("matplotlib", "scipy", "torchvision", "pyarrow", "transformers")


def test_lean_import_hides_the_extras_only_while_torchmetrics_is_imported(tmp_path, monkeypatch):
    """A stand-in ``torchmetrics`` package records what ``lightning_utilities``' checks answer during its import:
    ``False`` for the hidden names (both ``RequirementCache`` and ``package_available``), the truth for the others;
    after the import, a fresh check of a hidden name answers the truth again and the patched functions are
    restored."""
    from lightning_utilities.core import imports as lu

    import cli

    pkg = tmp_path / "torchmetrics"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from lightning_utilities.core.imports import RequirementCache, package_available
        SEEN = {"req_json": bool(RequirementCache("json")), "req_fake>=1.0": bool(RequirementCache("fakepkg>=1.0")),
                "avail_fake": package_available("fakepkg"), "avail_fake_sub": package_available("fakepkg.sub"),
                "avail_json": package_available("json")}
        LATE = RequirementCache("fakepkg")   # evaluated after the import: not hidden
    """))
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("__version__ = '2.0'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchmetrics", raising=False)
    real_check, real_available = lu.RequirementCache._check_available, lu.package_available
    cli.import_torchmetrics_lean(hidden=("fakepkg",))
    tm = sys.modules["torchmetrics"]
    assert tm.__file__.startswith(str(tmp_path))
    # json is importable and not hidden: True; fakepkg is importable (module_available) but hidden: False
    assert tm.SEEN == {"req_json": True, "req_fake>=1.0": False, "avail_fake": False, "avail_fake_sub": False,
                       "avail_json": True}
    assert lu.RequirementCache._check_available is real_check and lu.package_available is real_available
    assert bool(tm.LATE) is True and lu.package_available("fakepkg") is True
    # already imported: a no-op (the stand-in is not imported again)
    cli.import_torchmetrics_lean(hidden=("json",))
    assert sys.modules["torchmetrics"] is tm


@pytest.mark.slow
def test_predict_import_path_keeps_plotting_and_scipy_off():
    """A fresh interpreter that imports what ``evaluate.py predict`` imports before its run (the entry point, the
    CLI, the QA module, the data module, the writer / timing / scoring callbacks) has none of :data:`KEPT_OFF` in
    ``sys.modules``, while torchmetrics is imported (Lightning needs it) and still works."""
    code = textwrap.dedent(f"""
        import sys
        import evaluate, cli
        import lightning_modules.budgeted_qa, datamodules.videoqa
        import callbacks.jsonl_writer, callbacks.timing, callbacks.scoring
        import torchmetrics
        assert torchmetrics.classification.BinaryAUROC is not None
        print(sorted(m for m in {KEPT_OFF!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_persistent_compile_cache_location(monkeypatch, tmp_path):
    """``TORCHINDUCTOR_CACHE_DIR`` as set wins; else ``~/.cache/tokenbudget/inductor``, ``TOKENBUDGET_INDUCTOR_CACHE``
    naming another directory, or ``torch`` for PyTorch's default (nothing set)."""
    import os

    import cli

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TOKENBUDGET_INDUCTOR_CACHE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/given")
    assert cli.use_persistent_compile_cache() == "/given" and os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/given"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert cli.use_persistent_compile_cache() == str(tmp_path / ".cache" / "tokenbudget" / "inductor")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / ".cache" / "tokenbudget" / "inductor")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("TOKENBUDGET_INDUCTOR_CACHE", "torch")
    assert cli.use_persistent_compile_cache() is None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("TOKENBUDGET_INDUCTOR_CACHE", str(tmp_path / "c"))
    assert cli.use_persistent_compile_cache() == str(tmp_path / "c")


def test_kernels_compile_in_process_unless_the_user_set_a_count(monkeypatch):
    """``compile_kernels_in_process``: Inductor's ``compile_threads`` becomes 1 when ``TORCHINDUCTOR_COMPILE_THREADS``
    is not set; a count the user set (Inductor read it at import) stays."""
    import torch._inductor.config as inductor_config

    import cli

    monkeypatch.setattr(inductor_config, "compile_threads", 7)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "7")
    assert cli.compile_kernels_in_process() == 7 and inductor_config.compile_threads == 7
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS")
    assert cli.compile_kernels_in_process() == 1 and inductor_config.compile_threads == 1


def test_the_cli_compiles_in_process(tmp_path):
    """The entry point itself (``evaluate.py``, through ``build_cli``) runs with ``compile_threads`` 1: checked in a
    fresh process that builds the predict parser and prints Inductor's count."""
    code = textwrap.dedent("""
        import os, sys
        os.environ.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
        import cli, torch._inductor.config as c
        before = c.compile_threads
        try:
            cli.build_cli(["predict", "--print_config"], run=True)
        except SystemExit:
            pass
        print(before, c.compile_threads, file=sys.stderr)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "HOME": str(tmp_path)})
    before, after = out.stderr.strip().splitlines()[-1].split()
    assert after == "1", out.stderr[-2000:]
