"""Every predict/extract YAML in configs/ is instantiated through the CLI (classes built, no run). The fit and
sweep YAMLs are instantiated by tests/test_train.py."""
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs" / "predict").glob("*.yaml")) + sorted((REPO / "configs" / "extract").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_predict_config_instantiates(path, tmp_path):
    from lightning.pytorch import LightningDataModule, LightningModule

    import evaluate

    text = path.read_text()
    assert text.startswith("# python evaluate.py predict"), "each YAML starts with the command that runs it"
    cfg = yaml.safe_load(text)
    cfg.pop("return_predictions", None)  # a `predict` subcommand argument; run=False builds without subcommands
    plain = tmp_path / path.name
    plain.write_text(yaml.safe_dump(cfg))
    cli = evaluate.cli_main(["--config", str(plain)], run=False)
    assert isinstance(cli.model, LightningModule) and isinstance(cli.datamodule, LightningDataModule)
    assert type(cli.model).__name__ == cfg["model"]["class_path"].rsplit(".", 1)[1]
    assert type(cli.datamodule).__name__ == cfg["data"]["class_path"].rsplit(".", 1)[1]
