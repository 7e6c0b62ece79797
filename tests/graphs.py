"""CUDA-graph capture for GPU tests."""
from __future__ import annotations

from typing import Any, Callable, Tuple

import torch


def capture(run: Callable[[], Any]) -> Tuple["torch.cuda.CUDAGraph", Any]:
    """(graph, its output): ``run`` captured in a CUDA graph, after two calls on a side stream
    (compiles and autotuning stay outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out
