"""pytest marks of the GPU test modules of the Hopper (Gluon, sm90) kernels."""
from __future__ import annotations

from typing import List

import pytest
import torch


def hopper_unavailable() -> str | None:
    """Why the Hopper kernels cannot run here (None: an sm90 GPU with the Gluon API they
    are written for)."""
    if not torch.cuda.is_available():
        return "needs CUDA"
    from flashattn.backends.sm90.support import device_unavailable

    return device_unavailable(torch.device("cuda"))


def hopper_gpu_marks() -> List[pytest.MarkDecorator]:
    """``gpu``, and a skip naming the reason when the Hopper path is unavailable."""
    why = hopper_unavailable()
    if why:
        return [pytest.mark.gpu, pytest.mark.skip(reason=f"Hopper path unavailable: {why}")]
    return [pytest.mark.gpu]
