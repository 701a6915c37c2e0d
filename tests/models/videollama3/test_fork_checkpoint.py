"""Real original-layout checkpoints of the OnlineLong fork load and answer (issue 19).

The compressor part of the checkpoint is written here from the fork's own names, not by our writer: the key list is
read off chicheng567/OnlineLong ``videollama3/model/compressor.py`` (``TransformerDecoderFlatCompressor`` under
``Videollama3Qwen2Model.token_compressor``), the config dict is what the fork's ``_build_token_compressor_config``
writes plus the flat compressor's fields (``num_queries``, ``match_encoder_scale``, ``adaptive_segmentation``,
``segment_*``, training-only ``token_prune_ratio`` / ``distr_loss_weight``). Three kinds: with
``vision_encoder_config``; trained stage-wise without it; weights as ``pytorch_model.bin`` shards with an index and
the seed's original projector as a ``.pt`` state dict.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import run_predict
from models.videollama3.convert import main as convert_main
from models.videollama3.original_config import vision_config_from_weights
from models.videollama3.weight_files import read_safetensors_dir
from models.videollama3.original_layout import write_original_layout
from models.videollama3 import BudgetedVideoLlama3

C, INTER, HEADS, LAYERS, K = 32, 128, 2, 2, 64     # the tiny vision width; the compressor's own sizes
FORK_TOKEN_COMPRESSOR_CONFIG = {
    # _build_token_compressor_config(model_config, model_args, data_args)
    "compressor_type": "transformer_decoder_flat", "hidden_size": C, "intermediate_size": INTER,
    "num_layers": LAYERS, "num_attention_heads": HEADS, "attention_probs_dropout_prob": 0.0,
    "layer_norm_eps": 1e-6, "compress_image_w": 16, "compress_image_h": 16, "window_size": 1,
    # the flat compressor's fields (Videollama3TokenCompressorConfig)
    "num_queries": K, "match_encoder_scale": True, "adaptive_segmentation": True, "segment_target_frames": 4,
    "segment_force_every": 8, "segment_sample_tau": 0.0, "token_prune_ratio": 0.25, "token_prune_min_tokens": 0,
    "distr_loss_weight": 0.1, "distr_loss_max_ref_tokens": 4096,
}


def fork_compressor_shapes() -> dict[str, tuple[int, ...]]:
    """``model.token_compressor.*`` names and shapes of the fork's flat compressor (see the module docstring)."""
    shapes = {"query": (1, K, C), "out_gamma": (C,), "out_beta": (C,)}
    for i in range(LAYERS):
        for att in ("cross_attn", "self_attn"):
            for w in ("w_q", "w_k", "w_v", "w_o"):
                shapes[f"layers.{i}.{att}.{w}.weight"] = (C, C)
        for n in (1, 2, 3):
            shapes[f"layers.{i}.layer_norm{n}.weight"] = (C,)
            shapes[f"layers.{i}.layer_norm{n}.bias"] = (C,)
        shapes.update({f"layers.{i}.mlp.fc1.weight": (INTER, C), f"layers.{i}.mlp.fc1.bias": (INTER,),
                       f"layers.{i}.mlp.fc2.weight": (C, INTER), f"layers.{i}.mlp.fc2.bias": (C,)})
    return {"model.token_compressor." + k: v for k, v in shapes.items()}


@pytest.fixture(scope="module")
def fork_dir(tiny_vl3_dir, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """An original-layout checkpoint whose compressor weights and config are the fork's (kind 1)."""
    d = write_original_layout(tiny_vl3_dir, tmp_path_factory.mktemp("fork") / "onlinelong-ckpt")
    state = {k: v for k, v in read_safetensors_dir(d).items() if not k.startswith("model.token_compressor.")}
    g = torch.Generator().manual_seed(7)
    comp = {k: torch.randn(shape, generator=g) * 0.3 + (1.0 if k.endswith(("weight", "gamma")) and len(shape) == 1
                                                       else 0.0)
            for k, shape in fork_compressor_shapes().items()}
    state.update(comp)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg["token_compressor_config"] = FORK_TOKEN_COMPRESSOR_CONFIG
    cfg["vision_encoder"] = "DAMO-NLP-SG/SigLIP-NaViT"          # the fork stores the encoder's hub name here
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d, comp


def _compressor_equals(vlm, comp):
    have = vlm.compressor.state_dict()
    assert set(have) == {k[len("model.token_compressor."):] for k in comp}
    assert all(torch.equal(have[k[len("model.token_compressor."):]], v) for k, v in comp.items())


def test_fork_checkpoint_loads_strictly_and_answers_through_predict(fork_dir, demo_bench, tmp_path):
    d, comp = fork_dir
    vlm = BudgetedVideoLlama3.from_pretrained(d)
    _compressor_equals(vlm, comp)
    cfg = vlm.compressor.config
    assert cfg.match_encoder_scale and cfg.adaptive_segmentation and cfg.token_prune_ratio == 0.25
    records = run_predict(d, demo_bench, tmp_path / "out", budgets=(128,), model_args={"max_new_tokens": 2})
    assert records and not any(r.get("error") for r in records)
    assert any(r["n_compressed"] for r in records)            # the fork's compressor really ran


def test_stagewise_checkpoint_without_vision_encoder_config(fork_dir, tiny_vlm, tmp_path):
    src, comp = fork_dir
    d = Path(shutil.copytree(src, tmp_path / "stagewise"))
    cfg = json.loads((d / "config.json").read_text())
    vis = cfg.pop("vision_encoder_config")
    (d / "config.json").write_text(json.dumps(cfg))
    # the tiny encoder (width 32) is no known encoder: its head count is not in the weights, and the config's
    # vision_encoder is a hub name, which is never fetched
    with pytest.raises(ValueError, match="head count cannot be read .*vision_config_dir / --vision-config"):
        BudgetedVideoLlama3.from_pretrained(d)
    # a local directory the user names (kind 2a) ...
    vdir = tmp_path / "siglip-config"
    vdir.mkdir()
    (vdir / "config.json").write_text(json.dumps(vis))
    vlm = BudgetedVideoLlama3.from_pretrained(d, vision_config_dir=vdir)
    _compressor_equals(vlm, comp)
    # (the session's model is the checkpoint the fork folder was written from)
    assert vlm.model.config.vision_config.to_dict() == tiny_vlm.model.config.vision_config.to_dict()
    convert_main([str(d), str(tmp_path / "converted"), "--vision-config", str(vdir)])
    assert BudgetedVideoLlama3.from_pretrained(tmp_path / "converted").compressor.config.match_encoder_scale
    # ... or the fork's own field naming a local encoder directory (kind 2b)
    cfg["vision_encoder"] = str(vdir)
    (d / "config.json").write_text(json.dumps(cfg))
    assert BudgetedVideoLlama3.from_pretrained(d).model.config.vision_config.num_attention_heads == vis[
        "num_attention_heads"]


def test_vision_config_from_weight_shapes():
    # VideoLLaMA3's SigLIP-NaViT: patch embedding (1152, 3, 14, 14), fc1 (4304, 1152), 27 layers, 16 heads
    state = {"model.vision_encoder.embeddings.patch_embedding.weight": torch.empty(1152, 3, 14, 14, device="meta"),
             **{f"model.vision_encoder.encoder.layers.{i}.mlp.fc1.weight": torch.empty(4304, 1152, device="meta")
                for i in range(27)}}
    assert vision_config_from_weights(state) == {
        "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
        "num_channels": 3, "patch_size": 14}


def test_bin_shards_and_pt_original_projector(fork_dir, tiny_vl3_dir, tmp_path):
    src, comp = fork_dir
    d = Path(shutil.copytree(src, tmp_path / "bin-ckpt"))
    state = read_safetensors_dir(d)
    (d / "model.safetensors").unlink()
    keys = sorted(state)
    half = len(keys) // 2
    weight_map = {}
    for i, part in enumerate((keys[:half], keys[half:])):
        name = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({k: state[k] for k in part}, d / name)
        weight_map.update({k: name for k in part})
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    # seed 001: proj_orig.load_state_dict(torch.load(orig_projector_path, map_location="cpu", weights_only=True))
    proj = read_safetensors_dir(tiny_vl3_dir / "original_projector")
    shutil.rmtree(d / "original_projector")
    (d / "original_projector").mkdir()
    torch.save(proj, d / "original_projector" / "mm_projector.pt")
    vlm = BudgetedVideoLlama3.from_pretrained(d, raw_mode="orig")
    _compressor_equals(vlm, comp)
    have = vlm.original_projector.state_dict()
    assert set(have) == set(proj) and all(torch.equal(have[k], proj[k]) for k in proj)
    # the same .pt given by path to our own layout
    ours = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, raw_mode="orig",
                                               original_projector=d / "original_projector" / "mm_projector.pt")
    assert all(torch.equal(ours.original_projector.state_dict()[k], proj[k]) for k in proj)


def test_bad_compressor_configs_are_named(fork_dir, tmp_path):
    src, _ = fork_dir
    d = Path(shutil.copytree(src, tmp_path / "bad"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["token_compressor_config"] = {**FORK_TOKEN_COMPRESSOR_CONFIG, "compressor_type": "transformer_decoder_flat+mamba"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"compressor_type='transformer_decoder_flat\+mamba' .*supported: "
                                         r"transformer_decoder_flat"):
        BudgetedVideoLlama3.from_pretrained(d)
    cfg["token_compressor_config"] = FORK_TOKEN_COMPRESSOR_CONFIG
    cfg["trainable_mm_compressor"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no token compressor"):
        BudgetedVideoLlama3.from_pretrained(d)
