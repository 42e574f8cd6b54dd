"""Import-only stub."""


def to_tensor(picture: object) -> object:
    """Not available in the stub."""
    raise NotImplementedError("torchvision stub: to_tensor is not available")
