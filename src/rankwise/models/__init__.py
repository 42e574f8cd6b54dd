"""Reference models (``rankwise.models``): standard architectures built from ``torch.nn`` only.

torchvision would pull in a torch of its own; these let benchmarks, examples and the
TensorBrain guide's ``tb.nn.ResNet50()`` use a real ResNet-50 without it. ``VAE`` and ``MLP``
are the FRAMEWORM guide's small models (the VAE returns its own ``{"loss": ...}``). ``GPT`` (a
decoder LM) and ``resnet18_cifar`` (ResNet-18 on 32x32 images) are ``benchmarks/workloads.py``'s
realistic workloads.

>>> sum(p.numel() for p in ResNet50().parameters())
25557032
"""

from rankwise.models.cifar import BasicBlock, CifarResNet, resnet18_cifar
from rankwise.models.gpt import GPT, GPTConfig, lm_loss
from rankwise.models.resnet import Bottleneck, ResNet, ResNet50, resnet50
from rankwise.models.vae import MLP, VAE

__all__ = [
    "GPT",
    "MLP",
    "VAE",
    "BasicBlock",
    "Bottleneck",
    "CifarResNet",
    "GPTConfig",
    "ResNet",
    "ResNet50",
    "lm_loss",
    "resnet18_cifar",
    "resnet50",
]
