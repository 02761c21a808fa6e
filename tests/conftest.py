import pytest


def _cuda_device_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_device_present():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is visible here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
