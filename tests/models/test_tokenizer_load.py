"""models.tokenizer.load_tokenizer: the checkpoint's tokenizer with tokenizer.json parsed once, the same tokenizer as
transformers' AutoTokenizer.from_pretrained (the reference path)."""
from __future__ import annotations

import json
import shutil

from models.tokenizer import _added_tokens_of, load_tokenizer

MESSAGES = [{"role": "user", "content": "<|video_pad|> Which colour? (A) red <|compression_start|>x<|compression_end|> "
                                        "héllo 1234\n"}]


def _count_python_json_reads(monkeypatch) -> list[str]:
    """Names of the files Python's ``json.load`` reads from now on."""
    read, real = [], json.load

    def load(fp, *args, **kwargs):
        read.append(getattr(fp, "name", "?"))
        return real(fp, *args, **kwargs)

    monkeypatch.setattr(json, "load", load)
    return read


def test_same_tokenizer_as_autotokenizer_and_tokenizer_json_parsed_once(tiny_vl3_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from models.videollama3.chat_template import processor_chat_template

    reference = AutoTokenizer.from_pretrained(tiny_vl3_dir)
    read = _count_python_json_reads(monkeypatch)
    tok = load_tokenizer(tiny_vl3_dir)
    assert not [n for n in read if n.endswith("tokenizer.json")]   # only the tokenizers library parses it
    monkeypatch.undo()

    template = processor_chat_template(tiny_vl3_dir)   # what BudgetedVideoLlama3 renders prompts with
    for t in (reference, tok):
        t.chat_template = template
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ids == reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ids[:1] == [151644] and 151656 in ids and 151665 in ids and 151666 in ids   # <|im_start|>, video, markers
    assert tok.added_tokens_decoder == reference.added_tokens_decoder
    assert (tok.eos_token_id, tok.pad_token_id) == (reference.eos_token_id, reference.pad_token_id) == (151645, 151643)
    assert list(tok.init_kwargs) == list(reference.init_kwargs) and repr(tok.init_kwargs) == repr(reference.init_kwargs)
    # the same files written back
    tok.save_pretrained(tmp_path / "ours")
    reference.save_pretrained(tmp_path / "ref")
    names = sorted(p.name for p in (tmp_path / "ref").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ours").iterdir())
    assert all((tmp_path / "ours" / n).read_bytes() == (tmp_path / "ref" / n).read_bytes() for n in names)


def test_other_layouts_go_to_autotokenizer(tiny_vl3_dir, tmp_path, monkeypatch):
    """A config that lists its added tokens (as the hub's Qwen2.5 / VideoLLaMA3 ones do) is loaded unchanged."""
    import transformers

    d = tmp_path / "tok"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_vl3_dir / name, d / name)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    calls = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path, **kw: calls.append(kw) or real(path, **kw))
    load_tokenizer(d)
    assert calls == [{}]


def test_added_tokens_read_alone(tmp_path):
    """Only the library's layout (``added_tokens`` before ``model``) is read alone, also past the first 64 KiB."""
    many = [{"id": 10 + i, "content": f"<t{i:05d}>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i in range(2000)]   # ~250 KB of entries
    f = tmp_path / "tokenizer.json"
    f.write_text(json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": many,
                             "model": {"type": "BPE", "vocab": {"a": 0}}}))
    assert _added_tokens_of(f) == many
    f.write_text(json.dumps({"version": "1.0", "model": {"vocab": {"added_tokens": 1}}, "added_tokens": many}))
    assert _added_tokens_of(f) is None
    f.write_text('{"added_tokens": [{"content": "<x>"}]}')   # no id: not the library's entries
    assert _added_tokens_of(f) is None
    f.write_text('{"added_tokens": [')   # cut short: AutoTokenizer reports the file
    assert _added_tokens_of(f) is None



def test_built_tokenizer_is_a_new_copy_each_call():
    """build_qwen_tokenizer converts the ranks once per process; every call gets its own object, the full tokenizer
    (151,643 ranks + 24 added tokens, ChatML template), untouched by what a caller did to an earlier one."""
    from models.tokenizer import CHATML_TEMPLATE, build_qwen_tokenizer

    a, b = build_qwen_tokenizer(), build_qwen_tokenizer()
    assert a is not b and a._tokenizer is not b._tokenizer
    a.chat_template = "{{ 'changed' }}"
    a.add_tokens(["<only-in-a>"])
    assert len(a) == 151668 and len(b) == 151667 and "<only-in-a>" not in b.get_vocab()
    assert b.chat_template == CHATML_TEMPLATE
    text = "<|im_start|>user\n<|video_pad|>héllo<|compression_end|><|im_end|>"
    assert b(text).input_ids == [151644, 872, 198, 151656, 71, 18503, 385, 151666, 151645]
