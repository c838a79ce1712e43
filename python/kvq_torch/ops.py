"""Torch custom ops over kvq's device cache (torch.ops.kvq.*).

    append(handle, seq, k, v, anchor)            GPU-encode k, v [T, Hkv, D] into sequence seq
    append_batch(handle, k, v, anchor)           one token per sequence 0..B-1: k, v [B, Hkv, D]
    attend(handle, q, scale, anchor) -> out      decode attention, q [B, Hq, D], sequences 0..B-1
    decode_step(handle, k, v, q, scale, anchor) -> out
                                                 append_batch then attend, in one op
    attend_prefix(handle, seq, pos0, q, scale, anchor) -> out
                                                 q [T, Hq, D]: entry i attends over the first
                                                 pos0 + i + 1 tokens of seq (a causal chunk)

`handle` is the int register() returned for a DeviceCache. Everything runs on
the current CUDA stream (torch.cuda.current_stream(), handed to
kvq_cuda_cache_set_stream before each call). The C API takes float32: k, v
and q arrive in the model's dtype (bf16/f16) and are converted to contiguous
float32 here, one temporary copy per call; outputs come back in q's dtype.

`anchor` is a one-element int64 CPU tensor per cache that the append ops
mutate (it counts appended tokens) and the attend ops read: it orders each
attend after the appends before it and keeps the appends from being dropped
as dead code when torch.compile traces them (the fake implementations below
give the output shapes without touching the GPU). CUDA graphs cannot replay
these ops: sequence lengths and page tables live on the host side of the
cache (docs/pytorch.md, "torch.compile and CUDA graphs").
"""
import contextlib
import itertools

import torch

from .device_cache import DeviceCache

_CACHES = {}
_NEXT = itertools.count(1)


def register(dc: DeviceCache) -> int:
    """Makes dc reachable from the ops; returns its handle."""
    h = next(_NEXT)
    _CACHES[h] = dc
    return h


def unregister(handle: int):
    dc = _CACHES.pop(handle, None)
    if dc is not None:
        dc.close()


def cache_of(handle: int) -> DeviceCache:
    dc = _CACHES.get(handle)
    if dc is None:
        raise KeyError(f"kvq_torch: no device cache with handle {handle} (freed, or never registered)")
    return dc


def _f32(x):
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    return x


def _prepare(dc, t, what):
    if not t.is_cuda:
        raise ValueError(f"kvq_torch: {what} must be a CUDA tensor, not on {t.device}")
    dc.set_stream(torch.cuda.current_stream(t.device).cuda_stream)
    return _f32(t)


def _on(t):
    """libkvq works on the current device: make it t's (a no-op in the usual case)."""
    if t.device.index is None or t.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


def _check_kv(dc, k, v, n, what):
    want = (n, dc.n_kv_heads, dc.head_dim)
    if tuple(k.shape) != want or tuple(v.shape) != want:
        raise ValueError(f"kvq_torch.{what}: k and v must be {list(want)} (tokens, KV heads, head dim), "
                         f"got {list(k.shape)} and {list(v.shape)}")


@torch.library.custom_op("kvq::append", mutates_args=("anchor",))
def append(handle: int, seq: int, k: torch.Tensor, v: torch.Tensor, anchor: torch.Tensor) -> None:
    dc = cache_of(handle)
    _check_kv(dc, k, v, k.shape[0], "append")
    with _on(k):
        k32 = _prepare(dc, k, "k")
        v32 = _f32(v)
        dc.append(seq, k.shape[0], k32.data_ptr(), v32.data_ptr())
        # the temporaries must outlive the queued kernels: the caching
        # allocator reuses their memory only for work queued after this on
        # the same stream, which is exactly the stream the encoder runs on
    anchor.add_(k.shape[0])


@append.register_fake
def _(handle, seq, k, v, anchor):
    return None


@torch.library.custom_op("kvq::append_batch", mutates_args=("anchor",))
def append_batch(handle: int, k: torch.Tensor, v: torch.Tensor, anchor: torch.Tensor) -> None:
    dc = cache_of(handle)
    _check_kv(dc, k, v, k.shape[0], "append_batch")
    with _on(k):
        k32 = _prepare(dc, k, "k")
        v32 = _f32(v)
        dc.append_batch(k.shape[0], k32.data_ptr(), v32.data_ptr())
    anchor.add_(k.shape[0])


@append_batch.register_fake
def _(handle, k, v, anchor):
    return None


def _check_q(dc, q, what):
    if q.dim() != 3 or q.shape[2] != dc.head_dim or q.shape[1] % dc.n_kv_heads:
        raise ValueError(f"kvq_torch.{what}: q must be [entries, query heads (a multiple of "
                         f"{dc.n_kv_heads}), {dc.head_dim}], got {list(q.shape)}")


@torch.library.custom_op("kvq::attend", mutates_args=())
def attend(handle: int, q: torch.Tensor, scale: float, anchor: torch.Tensor) -> torch.Tensor:
    dc = cache_of(handle)
    _check_q(dc, q, "attend")
    with _on(q):
        q32 = _prepare(dc, q, "q")
        out = torch.empty_like(q32)
        dc.attend(q.shape[0], q32.data_ptr(), q.shape[1], scale, out.data_ptr())
    return out if q.dtype == torch.float32 else out.to(q.dtype)


@attend.register_fake
def _(handle, q, scale, anchor):
    return torch.empty_like(q)


@torch.library.custom_op("kvq::decode_step", mutates_args=("anchor",))
def decode_step(handle: int, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, scale: float,
                anchor: torch.Tensor) -> torch.Tensor:
    """append_batch(k, v) then attend(q) in one op: one dispatch per layer and
    step instead of two (the host cost of eager decoding is per op)."""
    dc = cache_of(handle)
    _check_kv(dc, k, v, k.shape[0], "decode_step")
    _check_q(dc, q, "decode_step")
    with _on(q):
        k32 = _prepare(dc, k, "k")
        v32, q32 = _f32(v), _f32(q)
        dc.append_batch(k.shape[0], k32.data_ptr(), v32.data_ptr())
        anchor.add_(k.shape[0])
        out = torch.empty_like(q32)
        dc.attend(q.shape[0], q32.data_ptr(), q.shape[1], scale, out.data_ptr())
    return out if q.dtype == torch.float32 else out.to(q.dtype)


@decode_step.register_fake
def _(handle, k, v, q, scale, anchor):
    return torch.empty_like(q)


@torch.library.custom_op("kvq::attend_prefix", mutates_args=())
def attend_prefix(handle: int, seq: int, pos0: int, q: torch.Tensor, scale: float,
                  anchor: torch.Tensor) -> torch.Tensor:
    dc = cache_of(handle)
    _check_q(dc, q, "attend_prefix")
    with _on(q):
        q32 = _prepare(dc, q, "q")
        out = torch.empty_like(q32)
        n = q.shape[0]
        dc.attend_prefix(seq, [pos0 + i + 1 for i in range(n)], q32.data_ptr(), q.shape[1], scale,
                         out.data_ptr())
    return out if q.dtype == torch.float32 else out.to(q.dtype)


@attend_prefix.register_fake
def _(handle, seq, pos0, q, scale, anchor):
    return torch.empty_like(q)
