"""The "kvq" attention function for transformers' AttentionInterface.

transformers calls it as  fn(module, query, key, value, attention_mask,
dropout=..., scaling=..., **kwargs)  with query [B, Hq, T, D] (RoPE applied)
and the key/value KVQCache.update() returned, i.e. the new chunk [B, Hkv, T, D]
and nothing older; it returns ([B, T, Hq, D], None).

- decode (T == 1): one batched GPU encode of the B new tokens, then the fused
  decode kernel over each row's pages (torch.ops.kvq.decode_step);
- prefill (T > 1) into an empty cache with KVQCache(prefill="sdpa"): SDPA over
  the chunk in the model's dtype (transformers' own sdpa_attention_forward,
  mask included), then the chunk is encoded;
- any other chunk (prefill="kvq", or a chunk after earlier tokens): encoded
  first, then its queries attend causally over the encoded pages
  (torch.ops.kvq.attend_prefix), in pieces ending on page ends when the f16 window is
  on, exactly as the C decoder's CUDA store does.

Padding (batches of unequal prompts): a row's padding positions, read from
the mask transformers built for the chunk, are never encoded; their outputs
are zeros. Positions (RoPE) are the model's business and were applied before.
"""
import torch

from . import ops  # noqa: F401  (registers torch.ops.kvq.*)
from .plan import row_entries

_active = None


def set_active(layer):
    """Called by KVQCache.update: the layer whose chunk the next call takes."""
    global _active
    _active = layer


def _row_validity(mask, B, T):
    """[B][T] booleans (True: a real token) from the chunk's 4D mask, or None
    when every position is real."""
    if mask is None or not torch.is_tensor(mask) or mask.dim() != 4:
        return None
    last = mask[:, 0, -1, -T:]  # the last query of a row sees every real position of the chunk
    ok = last if last.dtype == torch.bool else last == 0
    if bool(ok.all()):
        return None
    return ok.cpu().tolist()


def kvq_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    layer = _active
    if layer is None or layer.pending is None or (not torch.compiler.is_compiling() and layer.pending[0] is not key):
        raise RuntimeError("kvq attention: these keys did not come from a KVQCache; pass "
                           "past_key_values=kvq_torch.KVQCache(model.config, ...) (and use_cache=True)")
    k, v = layer.take()
    B, Hq, T, D = query.shape
    scale = float(scaling) if scaling is not None else D ** -0.5
    h, anchor, dc = layer.handle, layer.anchor, layer.dc
    if T == 1:
        out = torch.ops.kvq.decode_step(h, k[:, :, 0, :], v[:, :, 0, :], query[:, :, 0, :], scale, anchor)
        return out.unsqueeze(1), None

    valid = _row_validity(attention_mask, B, T)
    lens0 = [dc.length(b) for b in range(B)]
    if layer.owner.prefill == "sdpa" and not any(lens0):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        out, _ = sdpa_attention_forward(module, query, k, v, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        for b in range(B):
            pos = list(range(T)) if valid is None else [i for i in range(T) if valid[b][i]]
            kb, vb = _rows(k, b, pos), _rows(v, b, pos)
            torch.ops.kvq.append(h, b, kb, vb, anchor)
        return out, None

    out = query.new_zeros(B, T, Hq, D)
    for b in range(B):
        pos, _ = row_entries(lens0[b], [True] * T if valid is None else valid[b])
        kb, vb, qb = _rows(k, b, pos), _rows(v, b, pos), _rows(query, b, pos)
        p1 = 0
        while p1 < len(pos):
            p0 = p1
            room = dc.piece - (lens0[b] + p0) % dc.piece if dc.piece else len(pos)
            p1 = min(len(pos), p0 + room)
            torch.ops.kvq.append(h, b, kb[p0:p1], vb[p0:p1], anchor)
            ob = torch.ops.kvq.attend_prefix(h, b, lens0[b] + p0, qb[p0:p1], scale, anchor)
            if len(pos) == T:
                out[b, p0:p1] = ob
            else:
                out[b, pos[p0:p1]] = ob
    return out, None


def _rows(x, b, pos):
    """Row b of x [B, H, T, D] at chunk positions pos, as [len(pos), H, D]."""
    xb = x[b].transpose(0, 1)  # [T, H, D]
    if len(pos) == xb.shape[0]:
        return xb
    return xb[torch.tensor(pos, device=x.device)]


def register(name="kvq"):
    """Registers the attention function (and the SDPA mask format for it) with
    transformers under `name`; import kvq_torch does this once for "kvq"."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, kvq_attention_forward)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    except (ImportError, KeyError, AttributeError):
        pass  # without a registered mask transformers passes None: all positions real
    return name


def use_kvq(model, name="kvq"):
    """Switches a loaded model's attention to kvq (and back: use_kvq(model, "sdpa"))."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    # set_attn_implementation only warns for a model class it cannot check
    # (a source-text heuristic in some versions): set the configs directly then
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", name) != name:
            try:
                cfg._attn_implementation = name
            except (AttributeError, ValueError):
                cfg._attn_implementation_internal = name
    return model
