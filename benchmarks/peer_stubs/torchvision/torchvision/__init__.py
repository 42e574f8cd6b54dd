"""Import-only stub of torchvision: the names mosaicml-streaming imports, none usable."""
