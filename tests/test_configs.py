"""Every predict YAML in configs/ is instantiated through the CLI (classes built, no run). The extract YAMLs are
instantiated by tests/test_omni_extract.py (they load the thinker at construction), the fit and sweep YAMLs by
tests/test_train.py."""
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs" / "predict").glob("*.yaml"))


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


def test_missing_checkpoints_fail_fast_naming_the_path(tmp_path):
    """A model path that does not exist is an error naming it, never a hub lookup."""
    from models.omni import OmniThinkerRunner
    from models.videollama3 import BudgetedVideoLlama3

    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere.*models.tiny"):
        BudgetedVideoLlama3.from_pretrained(missing)
    with pytest.raises(FileNotFoundError, match="nowhere.*models.tiny_omni"):
        OmniThinkerRunner(missing)
