"""rlq.vision: CIFAR-10 files, offline digits, ImageNet folders, ResNet-32/AlexNet and the training loop with GST."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from rlq.compress import (
    GSTConfig,
    GSTSchedule,
    RewardAwareConfig,
    compression_ratio,
    covered_fraction,
    layer_report,
)
from rlq.compress.layers import classify_layers, covered_fraction_of
from rlq.experiments.paper import paper_numbers
from rlq.vision import (
    CIFAR10_CLASSES,
    GradualPruning,
    GradualPruningConfig,
    ImageData,
    SGDRecipe,
    alexnet,
    count_parameters,
    learning_rate,
    load_cifar10,
    load_digits_images,
    load_imagenet_folder,
    paper_comparison,
    random_shift,
    resnet32,
    summarize,
    train_classifier,
    write_cifar10_binary,
)
from rlq.vision.training import HISTORY_COLUMNS


def gst_schedule(total_steps: int, steps_per_epoch: int, tolerance: float = 0.01) -> GSTSchedule:
    """GST as gst_classification builds it: B = 4 from step 0, pruning from half of training, one accuracy an epoch."""
    sparsity = RewardAwareConfig(
        max_sparsity=0.8, step_size=0.05, backoff=0.05, window=1, tolerance=0.0, abs_tolerance=tolerance,
        min_episodes=1,
    )  # fmt: skip
    return GSTSchedule(GSTConfig(
        total_steps=total_steps, block_schedule=((0.0, 4),), transition_method="projection", bc_end=0.5,
        s_shift=1.0, prune_every=steps_per_epoch, sparsity=sparsity, networks="whole",
    ))  # fmt: skip


def pruning_schedule(total_steps: int, steps_per_epoch: int) -> GradualPruning:
    """Zhu and Gupta's gradual pruning to 80% over 20-80% of training, one update an epoch."""
    return GradualPruning(GradualPruningConfig(
        total_steps=total_steps, final_sparsity=0.8, start_fraction=0.2, end_fraction=0.8,
        prune_every=steps_per_epoch,
    ))  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # the test machines have 2 cores shared with other runs: oversubscribed threads make tiny models crawl
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def digits() -> ImageData:
    return load_digits_images(image_size=8, seed=0).with_validation(0.1, seed=0)


@pytest.fixture(scope="module")
def few_digits(digits) -> ImageData:
    return digits.subset(max_train=640)


def random_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, n)


# --- CIFAR-10 files ---------------------------------------------------------------------------------------


def test_cifar10_binary_round_trip(tmp_path):
    images, labels = random_images(60)
    write_cifar10_binary(tmp_path, images, labels)
    names = sorted(p.name for p in tmp_path.glob("*.bin"))
    assert names == [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    assert sum(p.stat().st_size for p in tmp_path.glob("*.bin")) == 60 * 3073
    # CIFAR-10's record layout: a label byte, then the red, green and blue planes, row-major
    raw = np.fromfile(tmp_path / "data_batch_1.bin", dtype=np.uint8)
    assert raw[0] == labels[0] and np.array_equal(raw[1:1025], images[0, 0].ravel())
    assert np.array_equal(raw[2049:3073], images[0, 2].ravel())
    data = load_cifar10(tmp_path)
    assert data.name == "cifar10" and data.classes == CIFAR10_CLASSES
    assert np.array_equal(data.train_images.numpy(), images[:50]) and np.array_equal(
        data.train_labels, labels[:50]
    )
    assert np.array_equal(data.test_images.numpy(), images[50:]) and np.array_equal(
        data.test_labels, labels[50:]
    )
    assert data.train_images.dtype == torch.uint8 and data.train_labels.dtype == torch.int64


def test_cifar10_python_version_in_its_archive_folder(tmp_path):
    images, labels = random_images(12, seed=1)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    parts = np.array_split(np.arange(10), 5)
    for i, index in enumerate(parts, start=1):
        batch = {b"data": images[index].reshape(len(index), -1), b"labels": labels[index].tolist()}
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    (folder / "test_batch").write_bytes(
        pickle.dumps({b"data": images[10:].reshape(2, -1), b"labels": labels[10:].tolist()})
    )
    data = load_cifar10(tmp_path)  # finds cifar-10-batches-py/ below the given folder
    assert np.array_equal(data.train_images.numpy(), images[:10]) and np.array_equal(
        data.test_labels, labels[10:]
    )


def test_cifar10_missing_files_are_named(tmp_path):
    images, labels = random_images(12)
    write_cifar10_binary(tmp_path, images, labels)
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3.bin") as info:
        load_cifar10(tmp_path)
    assert "never downloads" in str(info.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_cifar10(tmp_path / "nowhere")
    (tmp_path / "data_batch_1.bin").write_bytes(b"\x00" * 100)  # not whole records
    (tmp_path / "data_batch_3.bin").write_bytes(b"\x00" * 3073)
    with pytest.raises(ValueError, match="3073-byte"):
        load_cifar10(tmp_path)


# --- digits, augmentation, ImageNet folders ---------------------------------------------------------------


def test_digits_offline_at_cifar_size():
    data = load_digits_images(image_size=32, seed=0)
    assert data.image_shape == (3, 32, 32) and data.num_classes == 10
    assert len(data.train_images) + len(data.test_images) == 1797
    assert "offline" in data.source and data.augment == "crop"  # no flips for digits
    split = data.with_validation(0.1, seed=0)
    assert len(split.val_images) == round(0.1 * len(data.train_images))
    assert len(split.train_images) + len(split.val_images) == len(data.train_images)
    x, y = next(split.train_batches(32, torch.Generator().manual_seed(0)))
    assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32 and abs(float(x.mean())) < 0.5


def test_random_shift_keeps_pixels_and_shape():
    images = (
        torch.arange(2 * 3 * 8 * 8, dtype=torch.int64).remainder(250).add(1).to(torch.uint8).view(2, 3, 8, 8)
    )
    same = random_shift(images, torch.Generator().manual_seed(0), padding=0)
    assert torch.equal(same, images)
    shifted = random_shift(images, torch.Generator().manual_seed(0), flip=True, padding=2)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    present = set(images.unique().tolist()) | {0}
    assert set(shifted.unique().tolist()) <= present


def test_imagenet_folder_is_decoded(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    colors = {"n01": (255, 0, 0), "n02": (0, 0, 255)}
    for split, count in (("train", 3), ("val", 1)):
        for name, color in colors.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (30, 20), color).save(tmp_path / split / name / f"{i}.png")
    data = load_imagenet_folder(tmp_path, image_size=16)
    assert data.classes == ("n01", "n02") and data.train_images.shape == (6, 3, 16, 16)
    assert data.test_labels.tolist() == [0, 1]
    assert int(data.train_images[0, 0].min()) == 255 and int(data.train_images[-1, 2].min()) == 255
    with pytest.raises(FileNotFoundError, match="missing"):
        load_imagenet_folder(tmp_path, test="missing")


# --- models -----------------------------------------------------------------------------------------------


def test_resnet32_has_the_papers_size_and_shapes():
    model = resnet32()
    assert count_parameters(model) == 464_154  # He et al. 2016: 0.46M
    assert len([m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]) == 31
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert resnet32(width=4)(torch.randn(2, 3, 8, 8)).shape == (2, 10)  # digits at their own size


def test_alexnet_has_torchvisions_size():
    with torch.device("meta"):  # no 244 MB of weights
        model = alexnet()
        assert model(torch.empty(2, 3, 224, 224)).shape == (2, 1000)
    assert count_parameters(model) == 61_100_840
    eligible, _ = classify_layers(model, networks="whole")
    assert covered_fraction_of(model, [name for name, _ in eligible]) > 0.93


# --- GST on the ResNet, training, resume -------------------------------------------------------------------


def test_gst_on_resnet32_compresses_all_but_first_and_last():
    model = resnet32()
    schedule = GSTSchedule(GSTConfig(total_steps=100, networks="whole"))
    actions = schedule.apply_(model, 0)
    assert [a.kind for a in actions] == ["block_circulant"]
    report = schedule.last_reports["block_circulant"]
    assert set(report.dense) == {"conv1", "fc"} and len(report.compressed) == 30
    assert report.covered_fraction > 0.99 and covered_fraction(model) > 0.99
    assert compression_ratio(model) == pytest.approx(0.75 * report.covered_fraction, abs=1e-6)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_tiny_training_beats_chance(digits):
    torch.manual_seed(0)
    result = train_classifier(resnet32(width=4), digits, epochs=3, recipe=SGDRecipe(batch_size=64))
    history = result.history
    assert list(history.columns) == HISTORY_COLUMNS and len(history) == 3
    assert history["test_accuracy"].iloc[-1] > 0.4  # chance is 0.1
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    assert (history["compression_ratio"] == 0).all() and (history["phase"] == "dense").all()


def test_gst_training_stays_compressed(digits):
    torch.manual_seed(0)
    spe = digits.steps_per_epoch(64)
    schedule = gst_schedule(4 * spe, spe, tolerance=1.0)
    result = train_classifier(
        resnet32(width=8), digits, epochs=4, recipe=SGDRecipe(batch_size=64), schedule=schedule, method="gst"
    )
    history = result.history
    assert (
        history["compression_ratio"] > 0.7
    ).all()  # block-circulant from step 0, pruned after the hand-over
    assert history["phase"].tolist()[0] == "block_circulant" and history["phase"].tolist()[-1] == "pruning"
    assert history["avg_compression_ratio"].iloc[-1] > 0.7
    kinds = {row["name"]: row["kind"] for row in layer_report(result.model)}
    assert kinds["conv1"] == kinds["fc"] == "dense" and kinds["layer2.0.conv1"] == "pruned"


@pytest.mark.parametrize("method", ["pruning", "gst"])
def test_resume_repeats_the_uninterrupted_run(few_digits, tmp_path, method):
    digits = few_digits
    spe = digits.steps_per_epoch(64)

    def run(folder):
        torch.manual_seed(0)
        schedule = {"gst": gst_schedule, "pruning": pruning_schedule}[method](4 * spe, spe)
        return train_classifier(
            resnet32(width=4),
            digits,
            epochs=4,
            recipe=SGDRecipe(batch_size=64),
            schedule=schedule,
            method=method,
            checkpoint_dir=folder,
        )

    full = run(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["epoch_0003.pt", "epoch_0004.pt"]
    (tmp_path / "epoch_0004.pt").unlink()  # as if the run had stopped during epoch 4
    resumed = run(tmp_path)
    assert resumed.resumed_from == 3
    pd.testing.assert_frame_equal(
        resumed.history.drop(columns="wall_time_s"), full.history.drop(columns="wall_time_s"), atol=1e-6
    )
    with pytest.raises(ValueError, match="4 epochs"):
        train_classifier(
            resnet32(width=4),
            digits,
            epochs=5,
            recipe=SGDRecipe(batch_size=64),
            method=method,
            checkpoint_dir=tmp_path,
        )


# --- schedules and tables ---------------------------------------------------------------------------------


def test_gradual_pruning_follows_zhu_and_gupta():
    schedule = GradualPruning(GradualPruningConfig(total_steps=100, final_sparsity=0.8, prune_every=10))
    assert schedule.target(19) == 0.0 and schedule.target(80) == pytest.approx(0.8)
    assert schedule.target(50) == pytest.approx(0.8 * (1 - 0.5**3))
    model = resnet32(width=4)
    assert schedule.apply_(model, 10) == []
    [action] = schedule.apply_(model, 85)
    assert action.sparsity == pytest.approx(0.8) and compression_ratio(model) > 0.79


def test_learning_rate_schedules():
    assert [learning_rate(s, 100, 0.1) for s in (0, 49, 50, 75)] == pytest.approx([0.1, 0.1, 0.01, 0.001])
    assert learning_rate(100, 100, 0.1, "cosine") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="lr_schedule"):
        learning_rate(0, 100, 0.1, "warm")
    for bad, refused in [
        ({"lr_schedule": "warm"}, "lr_schedule"),
        ({"lr": 0}, "lr"),
        ({"batch_size": 0}, "batch"),
    ]:
        with pytest.raises(ValueError, match=refused):
            SGDRecipe(**bad)


def test_schedule_length_must_match_training(digits):
    schedule = pruning_schedule(7, 1)
    with pytest.raises(ValueError, match="plans 7 steps"):
        train_classifier(resnet32(width=4), digits, epochs=1, schedule=schedule)


def test_summary_and_paper_table():
    history = pd.DataFrame(
        [
            {
                "method": "dense",
                "epoch": 1,
                "test_accuracy": 0.9,
                "compression_ratio": 0.0,
                "avg_compression_ratio": 0.0,
                "wall_time_s": 1.0,
            },
            {
                "method": "gst",
                "epoch": 1,
                "test_accuracy": 0.88,
                "compression_ratio": 0.8,
                "avg_compression_ratio": 0.7,
                "wall_time_s": 1.0,
            },
        ]
    )
    summary = summarize(history)
    assert summary.set_index("method").loc["gst", "accuracy_drop_vs_dense"] == pytest.approx(2.0)
    table = paper_comparison(summary, paper_numbers("gst", experiment="cifar10"))
    assert table.set_index("metric").loc["accuracy (%)", "paper GST"] == pytest.approx(91.4)
    assert table.set_index("metric").loc[
        "compression, average over training (%)", "ours gst"
    ] == pytest.approx(70.0)
