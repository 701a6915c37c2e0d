"""Untrusted files (issue 8 §5): weights only through safetensors or ``torch.load(weights_only=True)``, never
``trust_remote_code``, no pickle. A static scan of every project source file and config, plus two behavioural
checks on a copy of the tiny checkpoint: a pickled weight file and a remote-code hook are never executed."""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

SKIP_DIRS = {".venv", ".venv-ci", ".git", "outputs", "checkpoints", "wandb", "build", "dist", "node_modules"}


def _sources(suffixes: tuple[str, ...]) -> list[Path]:
    out = []
    for p in REPO.rglob("*"):
        rel = p.relative_to(REPO).parts
        if p.is_file() and p.suffix in suffixes and not any(r in SKIP_DIRS or r.startswith(".") for r in rel[:-1]):
            out.append(p)
    return sorted(out)


def _is_true(node: ast.AST) -> bool:
    return not (isinstance(node, ast.Constant) and node.value in (False, None))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _violations(tree: ast.AST, torch_load_names: set[str]) -> list[tuple[int, str]]:
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if "trust_remote_code" in kw and _is_true(kw["trust_remote_code"]):
            bad.append((node.lineno, f"{name}(trust_remote_code=...) may run code shipped with a checkpoint"))
        if any(k.arg is None for k in node.keywords) and name.endswith("from_pretrained"):
            pass  # **kwargs: covered by the trust_remote_code string scan below
        if name == "torch.load" or name in torch_load_names:
            wo = kw.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                bad.append((node.lineno, "torch.load without weights_only=True unpickles arbitrary objects"))
        if name in ("pickle.load", "pickle.loads", "cPickle.load", "dill.load", "dill.loads", "joblib.load",
                    "cloudpickle.load", "cloudpickle.loads", "pd.read_pickle", "pandas.read_pickle"):
            bad.append((node.lineno, f"{name} unpickles arbitrary objects"))
        if name.endswith("np.load") or name.endswith("numpy.load"):
            if "allow_pickle" in kw and _is_true(kw["allow_pickle"]):
                bad.append((node.lineno, "np.load(allow_pickle=True) unpickles arbitrary objects"))
        if "use_safetensors" in kw and isinstance(kw["use_safetensors"], ast.Constant) \
                and kw["use_safetensors"].value is False:
            bad.append((node.lineno, "use_safetensors=False loads pickled weights"))
    return bad


def _torch_load_aliases(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.serialization"):
            names |= {a.asname or a.name for a in node.names if a.name == "load"}
    return names


def test_scan_finds_the_patterns_it_forbids():
    load = "torch." + "load"  # split so that repository-wide greps for unsafe loads do not match this sample
    src = ("import torch, pickle\nfrom torch import load as tl\n"
           f"{load}('x')\n{load}('x', weights_only=False)\ntl('y')\npickle.load(f)\n"
           "M.from_pretrained('d', trust_remote_code=True)\nnp.load('a', allow_pickle=True)\n"
           "torch.load('ok', weights_only=True)\nM.from_pretrained('d', trust_remote_code=False)\n")
    tree = ast.parse(src)
    lines = sorted(ln for ln, _ in _violations(tree, _torch_load_aliases(tree)))
    assert lines == [3, 4, 5, 6, 7, 8]


def test_no_unsafe_loading_in_the_source_tree():
    files = _sources((".py",))
    assert len(files) > 20 and any(f.relative_to(REPO).as_posix() == "models/videollama3/weight_files.py" for f in files)
    problems = []
    for f in files:
        if f.resolve() == Path(__file__).resolve():
            continue  # this file builds the payloads on purpose
        text = f.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(f))
        problems += [f"{f.relative_to(REPO)}:{ln}: {msg}" for ln, msg in _violations(tree, _torch_load_aliases(tree))]
        if "trust_remote_code" in text:  # also in **kwargs dicts, configs in code
            for ln, line in enumerate(text.splitlines(), 1):
                if "trust_remote_code" in line and "False" not in line:
                    problems.append(f"{f.relative_to(REPO)}:{ln}: mentions trust_remote_code")
    assert not problems, "\n".join(problems)


def test_no_remote_code_or_pickles_in_configs():
    problems = []
    for f in _sources((".yaml", ".yml", ".json", ".toml")):
        text = f.read_text(encoding="utf-8", errors="replace").lower()
        for ln, line in enumerate(text.splitlines(), 1):
            if "trust_remote_code" in line and "false" not in line:
                problems.append(f"{f.relative_to(REPO)}:{ln}: trust_remote_code")
            if any(ext in line for ext in (".bin", ".pt\"", ".pth", ".pkl", ".ckpt")) and "model_path" in line:
                problems.append(f"{f.relative_to(REPO)}:{ln}: a pickled weight file")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ behaviour
class _Payload:
    """Unpickling this runs ``open(marker, 'w')`` (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_weights_are_never_unpickled(tiny_vl3_dir, tmp_path):
    import pickle

    from models.videollama3 import BudgetedVideoLlama3

    live = tmp_path / "live"
    pickle.loads(pickle.dumps(_Payload(live)))
    assert live.exists()  # the payload is real: plain unpickling runs it
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_vl3_dir, ckpt)
    marker = tmp_path / "PWNED"
    for f in ckpt.rglob("*.safetensors"):
        (f.parent / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(marker)}))
    (ckpt / "model.safetensors").unlink()  # only the pickle is left for the language model
    with pytest.raises(Exception):
        BudgetedVideoLlama3.from_pretrained(ckpt)
    assert not marker.exists()
    # the qbase compressor reads safetensors only: with its safetensors gone, the pickle beside it is ignored
    from models.videollama3.qbase import TransformerDecoderFlatCompressor

    qdir = next(p.parent for p in ckpt.rglob("pytorch_model.bin") if p.parent.name == "qbase")
    for f in qdir.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        TransformerDecoderFlatCompressor.from_pretrained(qdir)
    assert not marker.exists()
    # an original-layout checkpoint's pytorch_model.bin is read with weights_only=True: the payload never runs
    from models.videollama3.weight_files import read_safetensors_dir

    with pytest.raises(Exception, match="(?i)weights_only|unpickl"):
        read_safetensors_dir(ckpt)
    assert not marker.exists()


def test_remote_code_in_a_checkpoint_is_not_run(tiny_vl3_dir, tmp_path):
    from models.videollama3 import BudgetedVideoLlama3

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_vl3_dir, ckpt)
    marker = tmp_path / "PWNED"
    code = f"open({str(marker)!r}, 'w').close()\n"
    for name in ("modeling_evil.py", "tokenization_evil.py", "configuration_evil.py"):
        (ckpt / name).write_text(code + "class Evil: pass\nEvilModel = EvilTokenizer = EvilConfig = Evil\n")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    tcfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    tcfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tcfg))
    try:
        BudgetedVideoLlama3.from_pretrained(ckpt)
    except Exception:  # noqa: BLE001 - refusing the checkpoint is fine too; running its code is not
        pass
    assert not marker.exists()


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_or_corrupted_checkpoint_files_name_the_path(tiny_vl3_dir, tmp_path):
    """A half-copied safetensors file or a broken qbase config is a CheckpointError naming the file or
    directory (one line at the entry points), not safetensors' bare header error."""
    from algorithms.errors import CheckpointError
    from cli import user_error
    from models.videollama3 import BudgetedVideoLlama3

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_vl3_dir, ckpt)
    _truncate(ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"^{ckpt}: a safetensors file cannot be read \(Error while "
                                              r"deserializing header") as info:
        BudgetedVideoLlama3.from_pretrained(ckpt)
    assert user_error(RuntimeError("wrapped")) is None and user_error(info.value) is info.value

    shutil.rmtree(ckpt)
    shutil.copytree(tiny_vl3_dir, ckpt)
    _truncate(ckpt / "qbase" / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"^{ckpt / 'qbase' / 'model.safetensors'}: a safetensors file"):
        BudgetedVideoLlama3.from_pretrained(ckpt)
    (ckpt / "qbase" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=rf"^{ckpt / 'qbase' / 'config.json'}: a config file is not valid "
                                              r"\(JSONDecodeError"):
        BudgetedVideoLlama3.from_pretrained(ckpt)


def test_truncated_omni_checkpoint_names_the_path(tmp_path):
    from algorithms.errors import CheckpointError
    from models.loading import load_omni_thinker
    from models.omni.tiny import build_tiny_omni

    ckpt = build_tiny_omni(tmp_path / "omni")
    for f in ckpt.glob("*.safetensors"):
        _truncate(f)
    with pytest.raises(CheckpointError, match=rf"^{ckpt}: a safetensors file cannot be read"):
        load_omni_thinker(ckpt)


def test_refused_pickles_templates_and_device_weights_are_one_line(tiny_vl3_dir, tmp_path):
    """Issue 44 item 9. Before: torch's refusal of a pickle ended "re-running with weights_only=False will likely
    succeed" (the unsafe fix); a chat template the Jinja sandbox refuses was a ``SecurityError`` traceback; a
    weights file linked to /dev/zero was transformers' ``OSError: Error no file named model.safetensors``."""
    import pickle

    from algorithms.errors import CheckpointError
    from cli import user_error
    from models.videollama3 import BudgetedVideoLlama3
    from models.videollama3.weight_files import read_safetensors_dir

    marker = tmp_path / "PWNED"
    ckpt = tmp_path / "pickle"
    shutil.copytree(tiny_vl3_dir, ckpt)
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(marker)}))
    (ckpt / "model.safetensors").unlink()
    refused = (": refused the pickled weights file pytorch_model.bin: it holds more than tensors, and unpickling can "
               "run code, so it is read with weights_only=True only. Convert the checkpoint to safetensors where "
               "you trust it (safetensors.torch.save_file of its state dict); do not load it with weights_only=False")
    with pytest.raises(CheckpointError) as info:
        BudgetedVideoLlama3.from_pretrained(ckpt)
    assert str(info.value) == f"{ckpt}{refused}" and user_error(info.value) is info.value
    with pytest.raises(CheckpointError) as info:       # the original-layout reader: the file itself named
        read_safetensors_dir(ckpt)
    assert str(info.value) == f"{ckpt / 'pytorch_model.bin'}{refused}"
    assert not marker.exists()

    ckpt = tmp_path / "template"
    shutil.copytree(tiny_vl3_dir, ckpt)
    (ckpt / "chat_template.jinja").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(CheckpointError) as info:
        BudgetedVideoLlama3.from_pretrained(ckpt)
    assert str(info.value) == (
        f"{ckpt}: the chat template (chat_template.jinja / tokenizer_config.json) does something transformers' "
        "sandbox forbids, so it was refused, not run (SecurityError: access to attribute '__class__' of 'str' "
        "object is unsafe.); use the template the checkpoint was released with")

    ckpt = tmp_path / "zero"
    shutil.copytree(tiny_vl3_dir, ckpt)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError) as info:
        BudgetedVideoLlama3.from_pretrained(ckpt)
    assert str(info.value) == (f"{ckpt / 'model.safetensors'}: the weights file is a device (a link to /dev/zero), "
                               "not a regular file; copy the checkpoint again")
