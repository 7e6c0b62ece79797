"""Which kernel computes the attention of a KV-cache call with FlashAttention-3's ``qv``
(multi-head latent attention): the Hopper MLA decode kernel where it covers the call, given
to the portable backend's decode call as its split partials (that call keeps the outputs, the
split workspace and the combine pass); otherwise the portable decode kernel."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from flashattn.dispatch import select as _select
from flashattn.params import AttnParams


def latent_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  qv: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                  params: AttnParams, leftpad: Optional[torch.Tensor],
                  batch_idx: Optional[torch.Tensor], capacity: int, fp8: Dict[str, Any],
                  varlen: bool = False) -> Dict[str, Any]:
    """The portable KV-cache functions' ``partials`` keyword for this call: ``{}`` (the
    portable decode kernel computes it) or ``{"partials": launcher}`` when the device starts
    from the Hopper family (``FLASHATTN_BACKEND`` auto or hopper, sm90) and its MLA decode
    kernel covers the call (``backends.sm90.latent.latent_unsupported``). ``params``: the
    call's, after ``dense.one_row_right_edge``; ``fp8``: the descales as
    ``kvcache.fp8_descales`` gives them."""
    if qv is None or _select.family_for(q) != "hopper":
        return {}
    hopper = _select.backend("hopper")
    if hopper.latent_unsupported(q, k_cache, v_cache, qv, block_table, p=params,
                                 leftpad=leftpad, batch_idx=batch_idx,
                                 k_descale=fp8.get("k_descale"),
                                 q_descale=fp8.get("q_descale"), varlen=varlen,
                                 v_descale=fp8.get("v_descale")) is not None:
        return {}
    return {"partials": hopper.latent_partials(params, capacity)}


def latent_split_waves(device: torch.device, nheads_k: int, headdim: int, headdim_v: int,
                       dtype: torch.dtype, page_size: Optional[int], window_left: int = -1,
                       window_right: int = -1, softcap: float = 0.0) -> Optional[float]:
    """The ``waves`` of the portable split decision for KV-cache calls of these shapes: 1.0
    where they are the Hopper MLA decode kernel's (one CTA per SM: its DecodeCall fills one
    wave of splits), None (the decode kernel's own rule) elsewhere. For FA3's
    ``get_scheduler_metadata``, which does not know whether ``qv`` will be given: MLA's shapes
    (one KV head of 64 / 512) are taken to be a qv call."""
    if _select.family_for(device) != "hopper":
        return None
    reason = _select.backend("hopper").latent_shapes_unsupported(
        nheads_k, headdim, headdim_v, dtype, page_size, window_left=window_left,
        window_right=window_right, softcap=softcap)
    return 1.0 if reason is None else None


__all__ = ["latent_kernel", "latent_split_waves"]
