"""Issue 10: checkpoints in the original VideoLLaMA3 layout (with a token compressor) -> ours, and direct loading."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.videollama3.convert import convert, main
from models.videollama3.original_weights import KEY_MAP
from models.videollama3.weight_files import SAFE_INDEX, read_safetensors_dir
from models.videollama3.original_layout import write_original_layout
from models.videollama3 import BudgetedVideoLlama3, prepare_budgets

MEDIA = Path(__file__).resolve().parents[3] / "assets" / "media"
QUESTIONS = ["What is in the video?\nAnswer briefly.", "Which color is the bird?"]
ORIGINAL_PREFIXES = tuple(p for p, _, _ in KEY_MAP)


@pytest.fixture(scope="module")
def orig_dir(tiny_vl3_dir, tmp_path_factory) -> Path:
    """The tiny checkpoint written in the original layout (one ``model.safetensors``)."""
    return write_original_layout(tiny_vl3_dir, tmp_path_factory.mktemp("orig") / "vl3-orig")


@pytest.fixture(scope="module")
def video():
    from datamodules.decode import decode_video

    return decode_video(MEDIA / "cockatoo.mp4", 1024)


def _answers(vlm, dec, budgets=(128, 1024)):
    out = []
    for bi in prepare_budgets(vlm, dec.frames, dec.times_s, list(budgets), raw_mode="orig"):
        out.append((bi.plan, bi.prompt, [a.token_ids for a in vlm.answer_all(bi.prompt, QUESTIONS, max_new_tokens=8)]))
    return out


def _rewrite_weights(directory: Path, edit) -> None:
    state = read_safetensors_dir(directory)
    edit(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})


def test_original_layout_converts_and_answers_exactly_as_source(tiny_vlm, orig_dir, video, tmp_path):
    # the original-layout checkpoint uses the original repository's module names only
    keys = set(read_safetensors_dir(orig_dir))
    assert {"model.vision_encoder.encoder.layers.0.self_attn.q_proj.weight", "model.mm_projector.readout.2.weight",
            "model.embed_tokens.weight", "model.layers.1.mlp.gate_proj.weight", "model.norm.weight",
            "model.token_compressor.query", "model.token_compressor.layers.1.cross_attn.w_k.weight"} <= keys
    assert not any(k.startswith(("model.vision_model.", "model.language_model.", "model.projector.")) for k in keys)
    cfg = json.loads((orig_dir / "config.json").read_text())
    assert cfg["model_type"] == "videollama3_qwen2" and "text_config" not in cfg and cfg["hidden_size"] == 64

    out = convert(orig_dir, tmp_path / "converted")
    assert (out / "qbase" / "model.safetensors").is_file() and (out / "original_projector").is_dir()
    converted = BudgetedVideoLlama3.from_pretrained(out, raw_mode="orig")
    direct = BudgetedVideoLlama3.from_pretrained(orig_dir, raw_mode="orig")
    for vlm in (converted, direct):  # special tokens carried over (plus the original's added <image>)
        ids = vlm.tokenizer.convert_tokens_to_ids
        for name in ("<|compression_start|>", "<|compression_end|>", "<|video_pad|>", "<|im_end|>"):
            assert ids(name) == tiny_vlm.tokenizer.convert_tokens_to_ids(name)
        assert ids("<image>") == cfg["image_token_index"]
        assert vlm.placeholder_id == tiny_vlm.placeholder_id

    ref = _answers(tiny_vlm, video)
    assert {p.mode for p, _, _ in ref} == {"forced8", "hybrid"}          # all-compressed and raw + compressed
    assert all(p.compressed for p, _, _ in ref) and any(p.n_raw_frames for p, _, _ in ref)
    assert all(len(tokens) == 8 for _, _, answers in ref for tokens in answers)
    for vlm in (converted, direct):
        got = _answers(vlm, video)
        for (p0, pr0, a0), (p1, pr1, a1) in zip(ref, got):
            assert p0 == p1
            assert torch.equal(pr0.ids, pr1.ids) and torch.equal(pr0.vision_embeds, pr1.vision_embeds)
            assert a0 == a1


def test_sharded_in_and_out_round_trip(tiny_vl3_dir, tiny_vlm, tmp_path):
    orig = write_original_layout(tiny_vl3_dir, tmp_path / "orig-sharded", max_shard_size="5MB")
    index = json.loads((orig / SAFE_INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (orig / "model.safetensors").exists()

    out = convert(orig, tmp_path / "ours-sharded", max_shard_size="5MB")
    assert len(set(json.loads((out / SAFE_INDEX).read_text())["weight_map"].values())) > 1
    src, got = read_safetensors_dir(tiny_vl3_dir), read_safetensors_dir(out)
    assert src.keys() == got.keys() and all(torch.equal(src[k], got[k]) for k in src)

    want = tiny_vlm.state_dict()
    for path in (out, orig):  # our sharded layout through transformers, and the sharded original directly
        vlm = BudgetedVideoLlama3.from_pretrained(path, raw_mode="orig")
        have = vlm.state_dict()
        assert have.keys() == want.keys() and all(torch.equal(have[k], want[k]) for k in want)



def test_training_repo_vision_prefix_and_cli(tiny_vl3_dir, tmp_path):
    orig = write_original_layout(tiny_vl3_dir, tmp_path / "orig-wrapped", wrapped_vision=True)
    assert "model.vision_encoder.vision_encoder.post_layernorm.weight" in read_safetensors_dir(orig)
    main([str(orig), str(tmp_path / "out"), "--max-shard-size", "20MB"])
    src, got = read_safetensors_dir(tiny_vl3_dir), read_safetensors_dir(tmp_path / "out")
    assert src.keys() == got.keys() and all(torch.equal(src[k], got[k]) for k in src)


def test_unknown_and_missing_keys_are_listed(orig_dir, tmp_path):
    bad = Path(shutil.copytree(orig_dir, tmp_path / "bad"))

    def edit(state):
        state["model.vision_encoder.encoder.layers.7.mlp.fc1.weight"] = torch.zeros(64, 32)  # beyond num layers
        state["model.time_adapter.weight"] = torch.zeros(3)                                  # no prefix fits
        del state["model.layers.0.mlp.up_proj.weight"]

    _rewrite_weights(bad, edit)
    for call in (lambda: convert(bad, tmp_path / "out"), lambda: BudgetedVideoLlama3.from_pretrained(bad)):
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert "model.vision_encoder.encoder.layers.7.mlp.fc1.weight" in msg
        assert "model.time_adapter.weight" in msg
        assert "model:model.language_model.layers.0.mlp.up_proj.weight" in msg
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_wrong_compressor_shapes_are_listed(orig_dir, tmp_path):
    bad = Path(shutil.copytree(orig_dir, tmp_path / "bad-shape"))
    _rewrite_weights(bad, lambda s: s.__setitem__("model.token_compressor.layers.1.mlp.fc1.weight", torch.zeros(64, 32)))
    with pytest.raises(ValueError) as e:
        convert(bad, tmp_path / "out")
    assert "model.token_compressor.layers.1.mlp.fc1.weight: checkpoint (64, 32) vs qbase config (128, 32)" in str(e.value)

    cfg_path = Path(shutil.copytree(orig_dir, tmp_path / "bad-config")) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["token_compressor_config"]["num_queries"] = 32
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model\.token_compressor\.query: checkpoint \(1, 64, 32\) vs qbase config "
                                         r"\(1, 32, 32\)"):
        BudgetedVideoLlama3.from_pretrained(cfg_path.parent)

    cfg["token_compressor_config"]["num_queries"] = 64
    cfg["compression_end_token_id"] = 5
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="compression_end_token_id=5"):
        convert(cfg_path.parent, tmp_path / "out2")


def test_original_layout_load_has_no_model_type_warning(orig_dir):
    """No transformers "model of type `videollama3_qwen2` to instantiate a model of type ``" line on an
    original-layout load (issue 43 item 5: a7fdaaf printed it on every such load); other config warnings still
    get through."""
    import logging

    from models.videollama3.convert import read_original

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    logger = logging.getLogger("transformers.configuration_utils")
    keep = Keep()
    logger.addHandler(keep)          # after the logger's filters: what its own handlers would print
    try:
        read_original(orig_dir)
        logger.warning("another config warning")
    finally:
        logger.removeHandler(keep)
    assert not [m for m in keep.messages if "to instantiate a model of type" in m]
    assert "another config warning" in keep.messages
