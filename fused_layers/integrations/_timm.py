"""timm: LayerNorm / LayerNorm2d (+ their Fp32 variants) and the ViT attention (an SDPA caller).

* ``timm.layers.norm.LayerNorm`` (an ``nn.LayerNorm`` whose forward is ``F.layer_norm`` unless timm's
  global "fast norm" mode is on) -> ``fused_layer_norm``, same semantics (including autocast).
* ``LayerNorm2d`` (channels-first NCHW: permute to NHWC, layer norm over C, permute back) -> the same
  permutes around ``fused_layer_norm``.  NCHW-contiguous input makes the permuted rows strided, so the
  kernel path copies it first (as ``F.layer_norm`` does internally); channels-last input needs no copy.
  The result is the same tensor, same strides, as timm's.
* ``LayerNormFp32`` / ``LayerNorm2dFp32`` (``F.layer_norm(x.float(), w.float(), b.float()).to(x.dtype)``)
  -> ``fused_layer_norm`` with float32 parameters (statistics and affine in float32, one rounding).
* A module built while timm's fast-norm mode was on (``_fast_norm`` True: apex-style low-precision
  layer norm under autocast) is left alone, with that reason.

Norms are matched by forward fingerprint (verified forwards below, timm 1.0.31).  The attention classes
(``timm.layers.attention.Attention``, ``AttentionRope``) call ``F.scaled_dot_product_attention`` when
their ``fused_attn`` is True; their fused subclass runs ``fused_attention`` there (``_sdpa.py``).  A
module with ``fused_attn`` False (``TIMM_FUSED_ATTN=0``) takes timm's explicit path and is left alone.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..ops._common import autocast_off
from ..ops.layer_norm import fused_layer_norm
from . import REGISTRY, LookAlike
from ._sdpa import build_sdpa_caller

TIMM_LN_FORWARD = '''
def forward(self, x: torch.Tensor) -> torch.Tensor:
    if self._fast_norm:
        x = fast_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
    else:
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
    return x
'''

TIMM_LN2D_FORWARD = '''
def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 2, 3, 1)
    if self._fast_norm:
        x = fast_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
    else:
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
    x = x.permute(0, 3, 1, 2)
    return x
'''

TIMM_LN_FP32_FORWARD = '''
def forward(self, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight.float() if self.weight is not None else None
    bias = self.bias.float() if self.bias is not None else None
    x = F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)
    return x
'''

TIMM_LN2D_FP32_FORWARD = '''
def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 2, 3, 1)
    weight = self.weight.float() if self.weight is not None else None
    bias = self.bias.float() if self.bias is not None else None
    x = F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)
    x = x.permute(0, 3, 1, 2)
    return x
'''


def _fast_norm_check(m: nn.Module) -> Optional[str]:
    if getattr(m, "_fast_norm", False):
        return "timm fast-norm mode (low-precision layer norm under autocast) is not what fused_layer_norm computes"
    return None


def _build_ln(cls: type) -> dict:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    return {"forward": forward}


def _build_ln2d(cls: type) -> dict:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = fused_layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)

    return {"forward": forward}


def _f32(t):
    return t.float() if t is not None else None


def _fp32_forward(x, m):
    # F.layer_norm(x.float(), ...) runs in float32 with or without autocast; so do the kernels given
    # float32 parameters, with x read in its own dtype (no float32 copy of x).
    with autocast_off(x):
        return fused_layer_norm(x, m.normalized_shape, _f32(m.weight), _f32(m.bias), m.eps).to(x.dtype)


def _build_ln_fp32(cls: type) -> dict:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fp32_forward(x, self)

    return {"forward": forward}


def _build_ln2d_fp32(cls: type) -> dict:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fp32_forward(x.permute(0, 2, 3, 1), self).permute(0, 3, 1, 2)

    return {"forward": forward}


def _attn_check(m: nn.Module) -> Optional[str]:
    if not getattr(m, "fused_attn", True):
        return "fused_attn=False (timm's explicit attention path, no SDPA call to replace)"
    return None


REGISTRY.extend([
    LookAlike("timm_layer_norm", "timm", "layer_norm", "timm.layers.norm.LayerNorm", _build_ln,
              forward_src=TIMM_LN_FORWARD, check=_fast_norm_check, note="timm LayerNorm"),
    LookAlike("timm_layer_norm_2d", "timm", "layer_norm", "timm.layers.norm.LayerNorm2d", _build_ln2d,
              forward_src=TIMM_LN2D_FORWARD, check=_fast_norm_check, note="timm LayerNorm2d (channels-first)"),
    LookAlike("timm_layer_norm_fp32", "timm", "layer_norm", "timm.layers.norm.LayerNormFp32", _build_ln_fp32,
              forward_src=TIMM_LN_FP32_FORWARD, note="timm LayerNormFp32"),
    LookAlike("timm_layer_norm_2d_fp32", "timm", "layer_norm", "timm.layers.norm.LayerNorm2dFp32", _build_ln2d_fp32,
              forward_src=TIMM_LN2D_FP32_FORWARD, note="timm LayerNorm2dFp32 (channels-first)"),
    LookAlike("timm_attention", "timm", "attention", "timm.layers.attention.Attention", build_sdpa_caller,
              classes=("timm.layers.attention.Attention", "timm.layers.attention.AttentionRope"), check=_attn_check,
              note="timm attention (its F.scaled_dot_product_attention call runs fused_attention)"),
])
