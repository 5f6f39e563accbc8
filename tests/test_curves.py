"""Training curves: a tiny training run writes TensorBoard events and PNG plots (avsr.train.curves)."""

import json

import pytest
from PIL import Image

from avsr.train.curves import TrainingCurves, plot_curves, read_train_log
from tests.test_trainer import make_trainer, setup  # noqa: F401  (setup is a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def scalar_tags(event_dir):
    """{tag: [(step, value)]} of the TensorBoard event files in ``event_dir``."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(event_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_training_run_writes_pngs_and_tensorboard_scalars(setup, tmp_path):  # noqa: F811
    tok, utts = setup
    trainer = make_trainer(tok, utts, tmp_path / "exp", max_epoch=2)
    trainer.run()
    images = tmp_path / "exp" / "images"
    for name in ("loss", "loss_ctc", "loss_att", "acc", "lr"):
        with Image.open(images / f"{name}.png") as im:
            im.load()  # decodes the whole file
            assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    log = read_train_log(tmp_path / "exp" / "train_log.jsonl")
    assert [r["epoch"] for r in log] == [1, 2]
    tags = scalar_tags(tmp_path / "exp" / "tensorboard")
    assert {
        "train/loss",
        "train/loss_ctc",
        "train/loss_att",
        "train/acc",
        "valid/loss",
        "valid/acc",
        "lr",
    } <= set(tags)
    assert [s for s, _ in tags["train/loss"]] == [1, 2]
    assert [v for _, v in tags["train/loss"]] == pytest.approx([r["train"]["loss"] for r in log], rel=1e-5)
    assert [v for _, v in tags["lr"]] == pytest.approx([r["lr"] for r in log], rel=1e-5)


def test_pretraining_statistics_get_their_own_plots_and_counters_none(tmp_path):
    records = [
        {
            "epoch": e,
            "step": 10 * e,
            "lr": 1e-3 / e,
            "train": {
                "loss": 5.0 - e,
                "loss_masked": 4.0 - e,
                "loss_unmasked": 3.0,
                "acc_masked": 0.1 * e,
                "acc_unmasked": 0.2 * e,
                "loss_features_pen": 0.5,
                "n_masked": 100.0,
            },
            "valid": {"loss": 5.5 - e, "acc_masked": 0.1 * e} if e > 1 else {},
        }
        for e in (1, 2, 3)
    ]
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    curves = TrainingCurves(tmp_path)
    curves.log_epoch(records[-1])
    curves.close()
    names = sorted(p.stem for p in (tmp_path / "images").glob("*.png"))
    assert names == [
        "acc_masked",
        "acc_unmasked",
        "loss",
        "loss_features_pen",
        "loss_masked",
        "loss_unmasked",
        "lr",
    ]
    assert scalar_tags(tmp_path / "tensorboard")["train/acc_masked"] == [(3, pytest.approx(0.3))]


def test_resumed_epochs_are_drawn_once_and_a_bad_log_line_is_named(tmp_path):
    log = tmp_path / "train_log.jsonl"
    log.write_text(
        '{"epoch": 1, "lr": 1, "train": {"loss": 3}}\n{"epoch": 1, "lr": 1, "train": {"loss": 2}}\n'
    )
    assert [r["train"]["loss"] for r in read_train_log(log)] == [2]
    assert {p.name for p in plot_curves(read_train_log(log), tmp_path / "img")} == {"loss.png", "lr.png"}
    log.write_text('{"epoch": 1}\nnot json\n')
    with pytest.raises(ValueError, match="train_log.jsonl:2"):
        read_train_log(log)
