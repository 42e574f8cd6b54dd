"""Import-only stub: the dataset classes mosaicml-streaming's vision module names."""


class VisionDataset:
    """Stub base class (mosaicml-streaming subclasses it; never instantiated here)."""


class CIFAR10(VisionDataset):
    """Stub (named by mosaicml-streaming's CIFAR-10 conversion script)."""
