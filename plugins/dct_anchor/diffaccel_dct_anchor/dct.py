"""Torch-native 2-D DCT-II on the spatial grid of feature maps, and its low-frequency band.

The orthonormal DCT-II of a map X (H, W) is ``D_H @ X @ D_W.T`` with the basis matrix
``D_N[k, n] = s_k cos(pi (n + 1/2) k / N)``, ``s_0 = sqrt(1/N)``, ``s_k = sqrt(2/N)``
(scipy's ``dctn(x, type=2, norm="ortho")``). The low band ``k x k`` needs only the first k rows of
each basis, so measuring it costs ``O(k H W)`` per channel instead of a full transform. Bases are
built once per (size, rows, device, dtype) and cached.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from diffaccel.kit.hygiene import deliberate


@lru_cache(maxsize=64)
def dct_basis(n: int, rows: int | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first ``rows`` rows (default all n) of the orthonormal DCT-II matrix of size n, (rows, n)."""
    rows = n if rows is None else rows
    with deliberate("the DCT basis: built once per size, device and dtype in float64 on the host, then cached"):
        k = torch.arange(rows, dtype=torch.float64)[:, None]
        i = torch.arange(n, dtype=torch.float64)[None, :]
        basis = torch.cos(math.pi * (i + 0.5) * k / n) * math.sqrt(2.0 / n)
        basis[0] /= math.sqrt(2.0)
        return basis.to(device=device, dtype=dtype)


def _basis_for(x: torch.Tensor, n: int, rows: int) -> torch.Tensor:
    # lru_cache needs hashable keys: the device as a string
    return dct_basis(n, rows, str(x.device), x.dtype)


def dct2(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal 2-D DCT-II over the last two dimensions of ``x`` (..., H, W)."""
    h, w = x.shape[-2:]
    return _basis_for(x, h, h) @ x @ _basis_for(x, w, w).T


def low_band(x: torch.Tensor, band: int) -> torch.Tensor:
    """The ``band x band`` lowest-frequency DCT-II coefficients of each map of ``x`` (..., H, W).

    Equal to ``dct2(x)[..., :band, :band]`` without computing the rest. Float16/bfloat16 inputs
    are measured in float32 (the energies are sums of many squares).
    """
    h, w = x.shape[-2:]
    if band > h or band > w:
        raise ValueError(f"band {band} is larger than the {h}x{w} map")
    if x.dtype in (torch.float16, torch.bfloat16):
        # the thresholds (0.01 by default) are relative changes of sums of squares, near bfloat16's
        # resolution; the maps measured are the latents (B, C, H, W), not activations
        with deliberate("DCT low band of float16/bfloat16 latents in float32: its energies' relative changes are thresholded"):
            x = x.float()
            return _basis_for(x, h, band) @ x @ _basis_for(x, w, band).T
    return _basis_for(x, h, band) @ x @ _basis_for(x, w, band).T


def band_energy(coeffs: torch.Tensor) -> torch.Tensor:
    """Energy per map of a band of coefficients (..., k, k) -> (...)."""
    return coeffs.square().sum(dim=(-2, -1))


def relative_energy_change(cur: torch.Tensor, ref: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Per batch row: sum over channels of |E_cur - E_ref| / sum of E_ref, from low-band
    coefficients (B, C, k, k). The energy of each channel's low band, compared channel by channel."""
    e_cur, e_ref = band_energy(cur), band_energy(ref)
    return (e_cur - e_ref).abs().flatten(1).sum(1) / e_ref.flatten(1).sum(1).clamp_min(eps)


def relative_band_change(cur: torch.Tensor, ref: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Per batch row: energy of the low-band difference over the low-band energy of ``ref``,
    ``||L(x) - L(x_ref)||^2 / ||L(x_ref)||^2`` (B, C, k, k) -> (B,). Sees moves of the layout that
    leave each channel's energy unchanged."""
    return (cur - ref).square().flatten(1).sum(1) / ref.square().flatten(1).sum(1).clamp_min(eps)


CRITERIA = {"energy": relative_energy_change, "band": relative_band_change}
# how each criterion grows with a small steady drift over g steps: linearly, or as its square
CRITERION_POWER = {"energy": 1, "band": 2}
