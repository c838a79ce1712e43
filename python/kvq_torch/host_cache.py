"""The CPU kvq_cache and kvq_attn_decode through ctypes: the reference the
device tests compare the torch ops with (same config and seed give the same
pages; kvq_cuda.h), and the check that this binding's structs match the C
ones (tests/test_pure.py). Torch-free: data goes in and out by pointer."""
from ctypes import byref, c_void_p

from . import _lib


class HostCache:
    def __init__(self, n_kv_heads, head_dim, max_tokens, type_k="tq3j", type_v="tq3", seed=0, recent_f16=False,
                 sink_tokens=0, max_q=8, center_k=None):
        L = _lib.lib()
        cfg = _lib.CacheConfig()
        L.kvq_cache_config_default(byref(cfg), int(n_kv_heads), int(head_dim), int(max_tokens))
        cfg.type_k = _lib.type_from_name(type_k)
        cfg.type_v = _lib.type_from_name(type_v)
        cfg.seed = int(seed)
        cfg.recent_f16 = 1 if recent_f16 else 0
        cfg.sink_tokens = int(sink_tokens)
        cfg.center_k = _lib.center_for(center_k, recent_f16, type_k)
        self._h, self._ws = c_void_p(), c_void_p()
        _lib.check(L.kvq_cache_create(byref(cfg), byref(self._h)), "kvq_cache_create")
        _lib.check(L.kvq_attn_workspace_create(int(head_dim), int(max_q), int(max_tokens), byref(self._ws)),
                   "kvq_attn_workspace_create")
        self.config = cfg

    def close(self):
        L = _lib.lib()
        if self._h:
            L.kvq_cache_free(self._h)
            self._h = None
        if self._ws:
            L.kvq_attn_workspace_free(self._ws)
            self._ws = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def length(self):
        return int(_lib.lib().kvq_cache_len(self._h))

    def layout(self):
        return _lib.lib().kvq_cache_layout(self._h).contents

    def append(self, n_tokens, k_ptr, v_ptr):
        """k_ptr, v_ptr: host float32 [n_tokens][n_kv_heads][head_dim]."""
        _lib.check(_lib.lib().kvq_cache_append(self._h, int(n_tokens), c_void_p(k_ptr), c_void_p(v_ptr)),
                   "kvq_cache_append")

    def decode(self, kv_head, n_ctx, q_ptr, n_q, scale, out_ptr):
        """q/out: host float32 [n_q][head_dim], the query heads of kv_head's group."""
        _lib.check(_lib.lib().kvq_attn_decode(self._h, int(kv_head), int(n_ctx), c_void_p(q_ptr), int(n_q),
                                              float(scale), c_void_p(out_ptr), self._ws), "kvq_attn_decode")
