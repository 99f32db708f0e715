"""rlq.vision: image classification for GST's classification claims (ResNet-32 on CIFAR-10, AlexNet on ImageNet).

Data in memory (:mod:`rlq.vision.datasets`) and where it comes from (:mod:`rlq.vision.sources`: CIFAR-10
from the user's files, sklearn's digits offline, ImageNet-style folders); the two networks in plain
PyTorch (:mod:`rlq.vision.models`); the interface of the compression schedules, rlq.compress's GST or the pruning
baseline (:mod:`rlq.vision.schedules`); a training loop that applies them, with checkpoints and resume
(:mod:`rlq.vision.training`); and Plotly figures of a comparison (:mod:`rlq.vision.figures`). It imports
rlq.compress and no RL library. Nothing is downloaded.
"""

from rlq.compress import GradualPruning, GradualPruningConfig
from rlq.vision.datasets import ImageData, random_shift
from rlq.vision.models import AlexNet, CifarResNet, alexnet, count_parameters, resnet32
from rlq.vision.sources import (
    CIFAR10_CLASSES,
    load_cifar10,
    load_digits_images,
    load_imagenet_folder,
    read_cifar10_binary_batch,
    read_cifar10_python_batch,
    write_cifar10_binary,
    write_cifar10_binary_batch,
)
from rlq.vision.training import (
    SGDRecipe,
    TrainedClassifier,
    evaluate_accuracy,
    latest_classifier_checkpoint,
    learning_rate,
    paper_comparison,
    summarize,
    train_classifier,
)

__all__ = [
    "CIFAR10_CLASSES",
    "AlexNet",
    "CifarResNet",
    "GradualPruning",
    "GradualPruningConfig",
    "ImageData",
    "SGDRecipe",
    "TrainedClassifier",
    "alexnet",
    "count_parameters",
    "evaluate_accuracy",
    "latest_classifier_checkpoint",
    "learning_rate",
    "load_cifar10",
    "load_digits_images",
    "load_imagenet_folder",
    "paper_comparison",
    "random_shift",
    "read_cifar10_binary_batch",
    "read_cifar10_python_batch",
    "resnet32",
    "summarize",
    "train_classifier",
    "write_cifar10_binary",
    "write_cifar10_binary_batch",
]
