"""One layer's kvq device cache (kvq_cuda_cache) behind a small Python class.

Torch-free: it takes device pointers (ints) and a CUDA stream handle, so the
torch ops (ops.py) stay thin. Host arrays the C calls read (sequence ids,
prefix lengths) are kept and reused, so a decode step allocates nothing.
"""
import ctypes
from ctypes import byref, c_int, c_size_t, c_void_p

from . import _lib
from .plan import layer_seed


class DeviceCache:
    """kvq_cuda_cache of one layer: max_seqs sequences (one per batch row) of
    n_kv_heads x head_dim keys/values, up to max_tokens each.

    type_k/type_v: cache type names ("tq3j", "tq3", "f16", ...); seed: the
    cache seed (the C decoder uses layer_seed(seed, layer)); recent_f16 /
    sink_tokens: the f16 overrides of kvq_cache.h (recent_f16 on is the `kvq`
    commands' default for compressed types); center_k: key centering
    (kvq_cache_config.center_k; None: on where the window is and the keys are
    compressed, the `kvq` commands' default); check_input: validate every
    appended row (one host synchronisation per append; the C decoder leaves
    it off); max_q_per_kv: the largest query-head group attend() will see."""

    def __init__(self, n_kv_heads, head_dim, max_tokens, max_seqs, type_k="tq3j", type_v="tq3", seed=0,
                 recent_f16=True, sink_tokens=0, check_input=False, max_q_per_kv=8, pool_pages=0,
                 page_tokens=0, center_k=None):
        L = _lib.lib()
        cfg = _lib.CudaCacheConfig()
        L.kvq_cuda_cache_config_default(byref(cfg), int(n_kv_heads), int(head_dim), int(max_tokens),
                                        int(max_seqs))
        cfg.cache.type_k = _lib.type_from_name(type_k)
        cfg.cache.type_v = _lib.type_from_name(type_v)
        cfg.cache.seed = int(seed)
        cfg.cache.recent_f16 = 1 if recent_f16 else 0
        cfg.cache.sink_tokens = int(sink_tokens)
        cfg.cache.center_k = _lib.center_for(center_k, recent_f16, type_k)
        if page_tokens:
            cfg.cache.page_tokens = int(page_tokens)
        cfg.check_input = 1 if check_input else 0
        cfg.max_q_per_kv = int(max_q_per_kv)
        cfg.pool_pages = int(pool_pages)
        handle = c_void_p()
        _lib.check(L.kvq_cuda_cache_create(byref(cfg), byref(handle)),
                   f"kvq_cuda_cache_create({n_kv_heads} KV heads x {head_dim}, {type_k}/{type_v}, "
                   f"{max_seqs} x {max_tokens} tokens)")
        self._h = handle
        self.n_kv_heads, self.head_dim = int(n_kv_heads), int(head_dim)
        self.max_seqs, self.max_tokens = int(max_seqs), int(max_tokens)
        self.type_k, self.type_v = type_k, type_v
        lay = L.kvq_cuda_cache_layout(handle).contents
        self.page_tokens = int(lay.page_tokens)
        self.page_bytes = int(lay.page_bytes)
        self.pool_pages = int(L.kvq_cuda_cache_free_pages(handle))
        self.recent_f16 = bool(recent_f16)
        # with the f16 window a prefill chunk goes in pieces that end on page
        # ends, as the C decoder's CUDA store does: the device ring holds the
        # page being filled (kvq_cuda.h)
        self.piece = self.page_tokens if recent_f16 else None
        self._all = (c_int * self.max_seqs)(*range(self.max_seqs))
        self._rep = None
        self._lens = None
        self._opts = _lib.AttnOpts(_lib.KVQ_CUDA_KERNEL_AUTO, 0)

    @classmethod
    def for_layer(cls, layer, seed=0, **kw):
        """A cache seeded as layer `layer` of the C decoder is."""
        return cls(seed=layer_seed(seed, layer), **kw)

    def close(self):
        if self._h:
            _lib.lib().kvq_cuda_cache_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- state ---------------------------------------------------------
    def length(self, seq):
        return int(_lib.lib().kvq_cuda_cache_len(self._h, int(seq)))

    def free_pages(self):
        return int(_lib.lib().kvq_cuda_cache_free_pages(self._h))

    def bytes_used(self):
        """Bytes of the pages the sequences hold now."""
        return (self.pool_pages - self.free_pages()) * self.page_bytes

    def bytes_pool(self):
        return self.pool_pages * self.page_bytes

    def fast_supported(self, n_q_heads):
        return bool(_lib.lib().kvq_cuda_fast_supported(self._h, int(n_q_heads)))

    def truncate(self, seq, n):
        _lib.check(_lib.lib().kvq_cuda_cache_truncate(self._h, int(seq), int(n)), f"kvq_cuda_cache_truncate(seq {seq}, {n})")

    def set_stream(self, stream):
        _lib.lib().kvq_cuda_cache_set_stream(self._h, c_void_p(int(stream)) if stream else None)

    # ---- work (pointers: float32 device memory, row-major) --------------
    def append(self, seq, n_tokens, k_ptr, v_ptr):
        """k_ptr, v_ptr: [n_tokens][n_kv_heads][head_dim] f32."""
        _lib.check(_lib.lib().kvq_cuda_cache_append(self._h, int(seq), int(n_tokens), c_void_p(k_ptr),
                                                    c_void_p(v_ptr)),
                   f"kvq_cuda_cache_append(seq {seq}, {n_tokens} tokens)")

    def append_batch(self, n_seqs, k_ptr, v_ptr):
        """One token for each of sequences 0..n_seqs-1; k_ptr, v_ptr: [n_seqs][n_kv_heads][head_dim] f32."""
        _lib.check(_lib.lib().kvq_cuda_cache_append_batch(self._h, int(n_seqs), self._all, c_void_p(k_ptr),
                                                          c_void_p(v_ptr)),
                   f"kvq_cuda_cache_append_batch({n_seqs} sequences)")

    def attend(self, n_seqs, q_ptr, n_q_heads, scale, out_ptr):
        """Sequences 0..n_seqs-1, one query position each; q/out: [n_seqs][n_q_heads][head_dim] f32."""
        _lib.check(_lib.lib().kvq_cuda_cache_attend(self._h, int(n_seqs), self._all, c_void_p(q_ptr),
                                                    int(n_q_heads), float(scale), c_void_p(out_ptr),
                                                    byref(self._opts)),
                   f"kvq_cuda_cache_attend({n_seqs} sequences, {n_q_heads} query heads)")

    def attend_prefix(self, seq, lens, q_ptr, n_q_heads, scale, out_ptr):
        """Entry i attends over the first lens[i] tokens of seq; q/out: [len(lens)][n_q_heads][head_dim] f32."""
        n = len(lens)
        if self._rep is None or len(self._rep) < n:
            self._rep = (c_int * max(n, 256))()
            self._lens = (c_size_t * max(n, 256))()
        for i in range(n):
            self._rep[i] = seq
        ctypes.memmove(self._lens, (c_size_t * n)(*lens), n * ctypes.sizeof(c_size_t))
        _lib.check(_lib.lib().kvq_cuda_cache_attend_prefix(self._h, n, self._rep, self._lens, c_void_p(q_ptr),
                                                           int(n_q_heads), float(scale), c_void_p(out_ptr),
                                                           byref(self._opts)),
                   f"kvq_cuda_cache_attend_prefix(seq {seq}, {n} entries)")
