"""``attn_implementation: flash_attention_2`` (the seeds' kernel, seed 001:1074) is offered where the flash_attn
package exists and refused in one line, before anything is written, where it does not (issue 42 item 7)."""
from __future__ import annotations

import importlib.util

import pytest

from algorithms.errors import SettingError
from lightning_modules.budgeted_qa import BudgetedQA
from lightning_modules.layout_ablation import LayoutAblationQA
from lightning_modules.omni_qa import OmniPruningQA
from models.loading import check_attn_implementation


def _pretend_installed(monkeypatch, installed: bool):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed else None) if name == "flash_attn" else real(name, *a))


@pytest.mark.parametrize("make", [
    lambda **kw: BudgetedQA(**kw),
    lambda **kw: LayoutAblationQA(jobs="base:128", **kw),
    lambda **kw: OmniPruningQA("/nonexistent/omni", **kw),
])
def test_flash_attention_2_needs_the_package_and_half_precision(monkeypatch, make):
    _pretend_installed(monkeypatch, False)
    with pytest.raises(SettingError, match=r"^model\.init_args\.attn_implementation=flash_attention_2 needs the "
                                           r"flash_attn package, which is not installed here"):
        make(attn_implementation="flash_attention_2", dtype="bfloat16")
    _pretend_installed(monkeypatch, True)
    with pytest.raises(SettingError, match="runs in half precision only: set model.init_args.dtype to bfloat16"):
        make(attn_implementation="flash_attention_2", dtype="float32")
    m = make(attn_implementation="flash_attention_2", dtype="bfloat16")
    assert m.hparams.attn_implementation == "flash_attention_2"
    assert make().hparams.attn_implementation == "sdpa"        # the default is unchanged


def test_vision_setting_checked_too(monkeypatch):
    _pretend_installed(monkeypatch, False)
    with pytest.raises(SettingError, match=r"^model\.init_args\.vision_attn_implementation=flash_attention_2"):
        BudgetedQA(vision_attn_implementation="flash_attention_2", dtype="bfloat16")
    check_attn_implementation("x", "sdpa", "float32")          # other backends pass unchecked
    check_attn_implementation("x", None, "float32")
