"""Where image data comes from: CIFAR-10 from the user's files, sklearn's digits offline, ImageNet folders.

Nothing is ever downloaded. :func:`load_cifar10` reads CIFAR-10 in either of its published formats from a
folder the user already has; :func:`load_digits_images` is the offline stand-in (sklearn's 8x8 handwritten
digits, shipped inside scikit-learn, optionally upsampled to 32x32 RGB); :func:`load_imagenet_folder`
decodes an ImageFolder-style tree with Pillow. All of them return an :class:`rlq.vision.datasets.ImageData`.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rlq.core.validation import check_positive_int
from rlq.vision.datasets import ImageData

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
#: CIFAR-10's binary record: one label byte, then 1024 red, 1024 green and 1024 blue bytes (32x32, row-major).
CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".ppm", ".webp")


# --- CIFAR-10 ---------------------------------------------------------------------------------------------


def read_cifar10_binary_batch(path: str | Path) -> tuple[Tensor, Tensor]:
    """Return ``(images uint8 (N, 3, 32, 32), labels int64)`` of one CIFAR-10 binary file (3073-byte records)."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % CIFAR10_RECORD_BYTES:
        raise ValueError(
            f"{path}: {raw.size} bytes is not a whole number of {CIFAR10_RECORD_BYTES}-byte CIFAR-10 records"
        )
    records = raw.reshape(-1, CIFAR10_RECORD_BYTES)
    labels = torch.from_numpy(records[:, 0].astype(np.int64))
    images = torch.from_numpy(records[:, 1:].reshape(-1, 3, 32, 32).copy())
    if int(labels.max()) >= len(CIFAR10_CLASSES):
        raise ValueError(f"{path}: label {int(labels.max())} out of range 0-9; is this CIFAR-100?")
    return images, labels


def read_cifar10_python_batch(path: str | Path) -> tuple[Tensor, Tensor]:
    """Return ``(images, labels)`` of one CIFAR-10 python-format file (a pickled dict with data and labels).

    Unpickling runs code from the file: read only files you trust (the official archive's).
    """
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (no data/labels entries)")
    images = torch.from_numpy(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32).copy())
    return images, torch.tensor(list(labels), dtype=torch.int64)


def write_cifar10_binary_batch(
    path: str | Path, images: Tensor | np.ndarray, labels: Tensor | np.ndarray
) -> Path:
    """Return ``path`` after writing uint8 images ``(N, 3, 32, 32)`` and labels 0-9 as CIFAR-10 binary records."""
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.dtype != np.uint8 or images.shape[1:] != (3, 32, 32):
        raise ValueError(f"images must be uint8 of shape (N, 3, 32, 32), got {images.dtype} {images.shape}")
    if labels.shape != (len(images),) or labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise ValueError(f"labels must be {len(images)} integers in 0-9")
    records = np.concatenate([labels.astype(np.uint8)[:, None], images.reshape(len(images), -1)], axis=1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records.tofile(path)
    return path


def write_cifar10_binary(
    folder: str | Path,
    images: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    test_images: Tensor | np.ndarray | None = None,
    test_labels: Tensor | np.ndarray | None = None,
) -> Path:
    """Return ``folder`` after writing a data set in CIFAR-10's binary layout (what :func:`load_cifar10` reads).

    The training images are spread over ``data_batch_1.bin`` .. ``data_batch_5.bin`` in order; the test
    images go to ``test_batch.bin``. Without ``test_images``, the given images are split like CIFAR-10's
    60,000 (the first five sixths train, the last sixth test). ``batches.meta.txt`` holds the class names.
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if test_images is None:
        if test_labels is not None:
            raise ValueError("test_labels given without test_images")
        cut = len(images) - len(images) // 6
        images, test_images, labels, test_labels = images[:cut], images[cut:], labels[:cut], labels[cut:]
    elif test_labels is None:
        raise ValueError("test_images given without test_labels")
    if len(images) < len(CIFAR10_TRAIN_FILES) or len(test_images) < 1:
        raise ValueError(
            f"need at least 5 training and 1 test image, got {len(images)} and {len(test_images)}"
        )
    folder = Path(folder)
    for name, index in zip(CIFAR10_TRAIN_FILES, np.array_split(np.arange(len(images)), 5), strict=True):
        write_cifar10_binary_batch(folder / f"{name}.bin", images[index], labels[index])
    write_cifar10_binary_batch(
        folder / f"{CIFAR10_TEST_FILE}.bin", np.asarray(test_images), np.asarray(test_labels)
    )
    (folder / "batches.meta.txt").write_text("\n".join(CIFAR10_CLASSES) + "\n")
    return folder


def _cifar10_layout(path: Path) -> tuple[Path, str]:
    """Return the folder holding CIFAR-10's batches under ``path`` and its format, or raise naming what is missing."""
    if path.is_file():
        hint = " (extract it first: tar xzf <archive>)" if path.name.endswith((".tar.gz", ".tgz")) else ""
        raise FileNotFoundError(f"{path} is a file; give the folder holding CIFAR-10's batch files{hint}")
    if not path.is_dir():
        raise FileNotFoundError(f"CIFAR-10 folder {path} does not exist")
    layouts = []
    for folder in (path, path / "cifar-10-batches-bin", path / "cifar-10-batches-py"):
        for fmt, suffix in (("binary", ".bin"), ("python", "")):
            wanted = [f"{name}{suffix}" for name in (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)]
            missing = [name for name in wanted if not (folder / name).is_file()]
            if not missing:
                return folder, fmt
            layouts.append((len(missing), folder, fmt, missing))
    _, folder, fmt, missing = min(layouts, key=lambda item: item[0])
    raise FileNotFoundError(
        f"no complete CIFAR-10 under {path}: the closest match, {fmt} format in {folder}, lacks "
        f"{', '.join(missing)}. Expected data_batch_1..5.bin and test_batch.bin (binary version) or "
        "data_batch_1..5 and test_batch (python version), in the folder itself or in cifar-10-batches-bin/ "
        "or cifar-10-batches-py/ below it. rlq never downloads data: get CIFAR-10 from "
        "https://www.cs.toronto.edu/~kriz/cifar.html yourself."
    )


def _cifar10_classes(folder: Path, fmt: str) -> tuple[str, ...]:
    if fmt == "binary" and (folder / "batches.meta.txt").is_file():
        names = [
            line.strip() for line in (folder / "batches.meta.txt").read_text().splitlines() if line.strip()
        ]
        if len(names) == len(CIFAR10_CLASSES):
            return tuple(names)
    if fmt == "python" and (folder / "batches.meta").is_file():
        with open(folder / "batches.meta", "rb") as f:
            meta = pickle.load(f, encoding="bytes")
        names = meta.get(b"label_names", meta.get("label_names"))
        if names is not None and len(names) == len(CIFAR10_CLASSES):
            return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    return CIFAR10_CLASSES


def load_cifar10(path: str | Path) -> ImageData:
    """Return CIFAR-10 (50,000 training and 10,000 test images, 3x32x32) read from the user's folder ``path``.

    Reads the binary version (``data_batch_1.bin`` .. ``data_batch_5.bin``, ``test_batch.bin``: 3073-byte
    records of one label byte and 3072 pixel bytes) or the python version (pickled ``data_batch_1`` ..
    ``test_batch``), in ``path`` itself or in the archive's ``cifar-10-batches-bin/`` or
    ``cifar-10-batches-py/`` below it. Raises FileNotFoundError naming the missing files. Nothing is downloaded.
    """
    folder, fmt = _cifar10_layout(Path(path).expanduser())
    read = read_cifar10_binary_batch if fmt == "binary" else read_cifar10_python_batch
    suffix = ".bin" if fmt == "binary" else ""
    parts = [read(folder / f"{name}{suffix}") for name in CIFAR10_TRAIN_FILES]
    test_images, test_labels = read(folder / f"{CIFAR10_TEST_FILE}{suffix}")
    return ImageData(
        train_images=torch.cat([p[0] for p in parts]),
        train_labels=torch.cat([p[1] for p in parts]),
        test_images=test_images,
        test_labels=test_labels,
        classes=_cifar10_classes(folder, fmt),
        name="cifar10",
        source=f"CIFAR-10 ({fmt} format) from {folder}",
        augment="crop_flip",
    )


# --- offline digits ---------------------------------------------------------------------------------------


def load_digits_images(
    image_size: int = 32, channels: int = 3, test_fraction: float = 0.2, seed: int = 0
) -> ImageData:
    """Return sklearn's handwritten digits (1,797 8x8 gray images, 10 classes) as an offline CIFAR stand-in.

    The digits ship inside scikit-learn, so this works with no network and no files. Pixel values 0-16
    are scaled to 0-255; ``image_size`` other than 8 resizes bilinearly (32 gives CIFAR's 32x32), and the
    gray channel is repeated ``channels`` times (3: the same first layer as for CIFAR). A random
    ``test_fraction`` is held out as the test split. Training augmentation: random shifts, no flips
    (a mirrored digit is another symbol).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_digits_images needs scikit-learn (pip install scikit-learn); it ships the digits offline"
        ) from e
    check_positive_int("image_size", image_size)
    check_positive_int("channels", channels)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    images = torch.from_numpy(digits.images).float().unsqueeze(1) * (255.0 / 16.0)  # (1797, 1, 8, 8)
    if image_size != 8:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = images.round().clamp(0, 255).to(torch.uint8).repeat(1, channels, 1, 1)
    labels = torch.from_numpy(digits.target).to(torch.int64)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * len(images)))
    test, train = order[:n_test].sort().values, order[n_test:].sort().values
    return ImageData(
        train_images=images[train],
        train_labels=labels[train],
        test_images=images[test],
        test_labels=labels[test],
        classes=tuple(str(d) for d in range(10)),
        name="digits",
        source=f"sklearn's load_digits (offline; 8x8 digits {'kept at 8x8' if image_size == 8 else f'resized to {image_size}x{image_size}'}, {channels} channel(s))",
        augment="crop",
    )


# --- ImageNet-style folders -------------------------------------------------------------------------------


def _decode_image(path: Path, image_size: int) -> np.ndarray:
    """Return an RGB image as uint8 ``(3, S, S)``: shorter side resized to ``S``, then the centre ``S x S`` crop."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        width, height = image.size
        scale = image_size / min(width, height)
        size = (max(image_size, round(width * scale)), max(image_size, round(height * scale)))
        image = image.resize(size, Image.BILINEAR)
        left, top = (size[0] - image_size) // 2, (size[1] - image_size) // 2
        image = image.crop((left, top, left + image_size, top + image_size))
        return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)


def _read_image_split(
    folder: Path, classes: tuple[str, ...], image_size: int, max_per_class: int
) -> tuple[Tensor, Tensor]:
    images, labels = [], []
    for label, name in enumerate(classes):
        files = (
            sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if (folder / name).is_dir()
            else []
        )
        if max_per_class > 0:
            files = files[:max_per_class]
        images.extend(_decode_image(p, image_size) for p in files)
        labels.extend([label] * len(files))
    if not images:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in the class folders of {folder}")
    return torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64)


def load_imagenet_folder(
    path: str | Path, image_size: int = 224, max_per_class: int = 0, train: str = "train", test: str = "val"
) -> ImageData:
    """Return an ImageNet-style tree decoded into memory with Pillow (for AlexNet; GST's ImageNet run).

    Layout (torchvision's ImageFolder): ``path/train/<class>/*.JPEG`` and ``path/val/<class>/*.JPEG``; the
    classes are the sorted folder names under ``train``. (ImageNet's official validation images come in one
    flat folder with a separate label file: sort them into class folders first.) Each image is resized so
    its shorter side is ``image_size`` and centre-cropped to ``image_size`` squared.

    Everything is held in memory as uint8: 3 * image_size**2 bytes per image, i.e. 150 KB at 224, so the
    full 1.28M-image ImageNet (190 GB) does not fit; use ``max_per_class`` and a smaller ``image_size``
    (e.g. 100 images per class at 64x64: 1.2 GB) or a 10-100 class subset such as Imagenette.
    """
    try:
        import PIL  # noqa: F401
    except ImportError as e:
        raise ImportError("load_imagenet_folder decodes images with Pillow: pip install pillow") from e
    root = Path(path).expanduser()
    train_dir, test_dir = root / train, root / test
    missing = [str(d) for d in (train_dir, test_dir) if not d.is_dir()]
    if missing:
        raise FileNotFoundError(
            f"ImageNet folder {root} lacks {', '.join(missing)}: expected {train}/<class>/<images> and "
            f"{test}/<class>/<images> (ImageFolder layout). rlq never downloads data."
        )
    classes = tuple(sorted(d.name for d in train_dir.iterdir() if d.is_dir()))
    if not classes:
        raise FileNotFoundError(f"{train_dir} holds no class folders")
    unknown = sorted(d.name for d in test_dir.iterdir() if d.is_dir() and d.name not in classes)
    if unknown:
        raise ValueError(f"{test_dir} has classes that {train_dir} lacks: {unknown[:5]}")
    train_images, train_labels = _read_image_split(train_dir, classes, image_size, max_per_class)
    test_images, test_labels = _read_image_split(test_dir, classes, image_size, max_per_class)
    return ImageData(
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        classes=classes,
        name="imagenet_folder",
        source=f"image folders under {root}, centre crops of {image_size}x{image_size}"
        + (f", at most {max_per_class} per class" if max_per_class > 0 else ""),
        augment="crop_flip",
    )
