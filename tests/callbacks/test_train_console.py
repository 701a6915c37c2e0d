"""The training console's Ctrl-C note: where the fit's last finished epoch is and the command that resumes it."""
from types import SimpleNamespace

from callbacks.run_log import take_interrupt_notes
from callbacks.train_console import EpochScores


def _trainer(last: str, fn: str = "fit", monitorless: bool = False):
    """A fit's trainer whose checkpoint of the last epoch is ``last``: a ``save_last`` callback's, or (the shipped
    configs) the file of a second, monitor-less ModelCheckpoint."""
    if monitorless:
        callbacks = [SimpleNamespace(monitor="val/auroc_mean", last_model_path="", best_model_path="best.ckpt"),
                     SimpleNamespace(monitor=None, last_model_path="", best_model_path=last)]
    else:
        callbacks = [SimpleNamespace(monitor="val/auroc_mean", last_model_path=last, best_model_path="best.ckpt")]
    return SimpleNamespace(state=SimpleNamespace(fn=fn), is_global_zero=True, checkpoint_callback=callbacks[0],
                           checkpoint_callbacks=callbacks)


def test_ctrl_c_during_fit_names_last_ckpt_and_the_resume_command(tmp_path, monkeypatch):
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"x")
    monkeypatch.setattr("sys.argv", ["train.py", "fit", "--config", "a.yaml", "--ckpt_path=old.ckpt"])
    take_interrupt_notes()
    EpochScores().on_exception(_trainer(str(last)), None, KeyboardInterrupt())
    assert take_interrupt_notes() == [f"the last finished epoch is in {last}; resume it: "
                                      f"python train.py fit --config a.yaml --ckpt_path={last}"]
    EpochScores().on_exception(_trainer(str(last), monitorless=True), None, KeyboardInterrupt())
    assert take_interrupt_notes() == [f"the last finished epoch is in {last}; resume it: "
                                      f"python train.py fit --config a.yaml --ckpt_path={last}"]
    EpochScores().on_exception(_trainer(str(last), fn="test"), None, KeyboardInterrupt())   # not a fit
    EpochScores().on_exception(_trainer(""), None, KeyboardInterrupt())                 # no epoch finished yet
    EpochScores().on_exception(_trainer(str(last)), None, ValueError("x"))              # not an interrupt
    assert take_interrupt_notes() == []
