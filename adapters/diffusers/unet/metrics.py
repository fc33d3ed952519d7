"""Image quality of accelerated runs against unaccelerated ones.

* ``psnr``: per image, 10 log10(1 / MSE) on pixels in [0, 1], over every pixel and channel;
  the mean over images is reported. An image identical to its reference has infinite PSNR.
* ``ssim``: per image, the structural similarity of Wang et al. (2004) with an 11x11 Gaussian
  window (sigma 1.5), K1 = 0.01, K2 = 0.03, data range 1, averaged over the valid window
  positions and the channels; the mean over images is reported. Identical images give 1.0.
  Images smaller than the window use a window of their size.

The digits models' conditioning accuracy is the digits task's (``diffaccel.adapters.diffusers.digits``:
``class_accuracy``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(x).double()
    return x[None] if x.dim() == 3 else x


def psnr_per_image(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> list[float]:
    """PSNR in dB of each image pair (B, C, H, W); inf where the images are identical."""
    a, b = _as_batch(a), _as_batch(b)
    mse = ((a - b) ** 2).flatten(1).mean(1)
    return [math.inf if m == 0 else 10.0 * math.log10(data_range**2 / float(m)) for m in mse]


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> float:
    """Mean per-image PSNR (dB) of two batches of images in [0, data_range]."""
    vals = psnr_per_image(a, b, data_range)
    return sum(vals) / len(vals)


def _gaussian_window(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim_per_image(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0, window: int = 11,
                   sigma: float = 1.5) -> list[float]:
    """SSIM of each image pair (B, C, H, W), Gaussian window, mean over positions and channels."""
    a, b = _as_batch(a), _as_batch(b)
    if a.shape != b.shape:
        raise ValueError(f"image shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    C = a.shape[1]
    size = min(window, a.shape[-1], a.shape[-2])
    w = _gaussian_window(size, sigma).expand(C, 1, size, size).contiguous()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2

    def blur(x):
        return F.conv2d(x, w, groups=C)

    mu_a, mu_b = blur(a), blur(b)
    saa = blur(a * a) - mu_a**2
    sbb = blur(b * b) - mu_b**2
    sab = blur(a * b) - mu_a * mu_b
    num = (2 * mu_a * mu_b + c1) * (2 * sab + c2)
    den = (mu_a**2 + mu_b**2 + c1) * (saa + sbb + c2)
    return [float(v) for v in (num / den).flatten(1).mean(1)]


def ssim(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> float:
    """Mean per-image SSIM of two batches of images in [0, data_range]."""
    vals = ssim_per_image(a, b, data_range)
    return sum(vals) / len(vals)
