"""A histogram observer's qparams: torchao's search, its bin scans on Python floats.

``HistogramObserver.calculate_qparams`` narrows the observed range step by step (the L2
search in ``_non_linear_param_search``); each step scans the cumulative histogram bin by bin,
and each look at a bin indexes a tensor and compares it with a Python number: tens of
thousands of one-element tensor operations per observer, ~60% of the search's time (resnet18:
30 observers, ~0.12 s). Here the cumulative histogram is read once into Python floats and the
scans compare those, with torch's arithmetic: a float32 tensor compared with a Python number
compares in float32 (the number rounded to float32 first), so each bound is rounded to
float32 before comparing, and float32 values compare exactly as Python floats. Everything
else (the steps, the quantization error of each candidate range, the final min/max and
qparams) is torchao's own code on the observer's tensors, so the answer is the same tensor
bits (``tests/test_quantize_histogram.py`` compares it with torchao's on hazards).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torchao.quantization.pt2e.observer import HistogramObserver

#: Off: torchao's own search (the tests compare both ways).
ENABLED = True


def exact_type(observer: object) -> bool:
    """Is ``observer`` torchao's own ``HistogramObserver`` (not a subclass that may change it)?"""
    return type(observer) is HistogramObserver


def calculate_qparams(observer: HistogramObserver) -> tuple[torch.Tensor, torch.Tensor]:
    """``observer.calculate_qparams()``, the same tensors."""
    uninitialized = observer.min_val == float("inf") and observer.max_val == float("-inf")
    if uninitialized or observer.bins != len(observer.histogram):
        return HistogramObserver.calculate_qparams(observer)  # its warning or its assertion
    new_min, new_max = _search(observer)
    return observer._calculate_qparams(new_min, new_max)


def _f32(x: float) -> float:
    """``x`` rounded to float32 (as torch rounds a Python number compared with a float32 tensor)."""
    return float(np.float32(x)) if math.isfinite(x) else x


def _search(obs: HistogramObserver) -> tuple[torch.Tensor, torch.Tensor]:
    """``HistogramObserver._non_linear_param_search``, step for step."""
    bin_width = (obs.max_val - obs.min_val) / obs.bins
    total = torch.sum(obs.histogram).item()
    csum = torch.cumsum(obs.histogram, dim=0).tolist()  # float32 values, exact as floats

    stepsize = 1e-5
    alpha, beta = 0.0, 1.0
    start_bin, end_bin = 0, obs.bins - 1
    norm_min = float("inf")
    while alpha < beta:
        next_alpha = alpha + stepsize
        next_beta = beta - stepsize
        left, right = start_bin, end_bin
        if left < end_bin:  # (a bound is rounded only where a scan reads it: idle steps stay cheap)
            low = _f32(next_alpha * total)
            while left < end_bin and csum[left] < low:
                left += 1
        if right > start_bin:
            high = _f32(next_beta * total)
            while right > start_bin and csum[right] > high:
                right -= 1
        next_start_bin, next_end_bin = start_bin, end_bin
        if (left - start_bin) > (end_bin - right):
            next_start_bin = left
            alpha = next_alpha
        else:
            next_end_bin = right
            beta = next_beta
        if next_start_bin == start_bin and next_end_bin == end_bin:
            continue
        norm = obs._compute_quantization_error(next_start_bin, next_end_bin)
        if norm > norm_min:
            break
        norm_min = norm
        start_bin, end_bin = next_start_bin, next_end_bin

    new_min = obs.min_val + bin_width * start_bin
    new_max = obs.min_val + bin_width * (end_bin + 1)
    return new_min, new_max
