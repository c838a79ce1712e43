"""KVQCache: a transformers Cache whose layers keep K/V in kvq pages.

Each layer owns one kvq device cache (DeviceCache) with one kvq sequence per
batch row. The cache is sized from the tensors it receives (batch, KV heads,
head dim), not from the config's head counts, so under tensor parallelism
(torchrun, tp_plan="auto"), where each rank sees only its own KV heads, it
needs no change.

update() does not keep bf16 K/V: it hands the new chunk to the "kvq"
attention function (attention.py), which encodes it into the pages and
attends. The two are used together:

    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvq")
    model.generate(ids, past_key_values=KVQCache(model.config, k="tq3j", v="tq3"))
"""
import torch

from transformers.cache_utils import Cache, CacheLayerMixin

from . import _lib, attention, ops
from .device_cache import DeviceCache
from .plan import layer_seed


class KVQLayer(CacheLayerMixin):
    """One layer: its DeviceCache (created on the first update, from the
    shapes seen there), the chunk waiting for the attention function, and the
    number of positions forwarded (padding included: transformers counts
    positions; padding is never stored in the pages)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner, layer_idx):
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self.dc = None
        self.handle = None
        self.anchor = torch.zeros(1, dtype=torch.int64)
        self.pending = None
        self.seen = 0
        self.is_initialized = False

    def lazy_initialization(self, key_states, *args, **kwargs):
        o = self.owner
        B, Hkv, _, D = key_states.shape
        if key_states.device.type != "cuda":
            raise ValueError(f"KVQCache layer {self.layer_idx}: keys on {key_states.device}; kvq's pages live on a "
                             "CUDA device (load the model with device_map=\"cuda\" or move it there)")
        self.dtype, self.device = key_states.dtype, key_states.device
        # a key-outlier layer (key_outlier_layers) keeps its keys in f16, as the C decoder does
        type_k = "f16" if self.layer_idx in o.f16_key_layers and o.k not in ("f16", "f32") else o.k
        with torch.cuda.device(key_states.device):
            self.dc = DeviceCache(n_kv_heads=Hkv, head_dim=D, max_tokens=o.kvq_max_len, max_seqs=B,
                                  type_k=type_k, type_v=o.v, seed=layer_seed(o.seed, self.layer_idx),
                                  recent_f16=o.recent_f16, sink_tokens=o.sink_tokens, check_input=o.check_input,
                                  max_q_per_kv=o.max_q_per_kv,
                                  center_k=o.center_k and _lib.compressed(type_k))
        self.handle = ops.register(self.dc)
        self.batch = B
        self.is_initialized = True

    def update(self, key_states, value_states, cache_kwargs=None):
        if not self.is_initialized:
            self.lazy_initialization(key_states)
        if key_states.shape[0] != self.batch:
            raise ValueError(f"KVQCache layer {self.layer_idx}: batch {key_states.shape[0]} after {self.batch} "
                             "(a KVQCache serves one batch; make a new one)")
        if self.pending is not None:
            raise RuntimeError("KVQCache: the previous chunk of layer %d was never attended: the model must run "
                               "with attn_implementation=\"kvq\" (kvq_torch.register() and "
                               "model.set_attn_implementation(\"kvq\"))" % self.layer_idx)
        self.pending = (key_states, value_states)
        self.seen += key_states.shape[-2]
        return key_states, value_states

    def take(self):
        kv, self.pending = self.pending, None
        return kv

    def get_seq_length(self, *args, **kwargs):
        return self.seen

    def get_mask_sizes(self, query, *args, **kwargs):
        q = query if isinstance(query, int) else int(query.shape[0])
        return self.seen + q, 0

    def get_max_cache_shape(self, *args, **kwargs):
        return -1  # grows like a DynamicCache (up to kvq_max_len, which the C cache enforces)

    @property
    def max_cache_len(self):
        return self.owner.kvq_max_len

    @property
    def max_batch_size(self):
        return getattr(self, "batch", 0)

    def bytes_used(self):
        return self.dc.bytes_used() if self.dc else 0

    def free(self):
        if self.handle is not None:
            ops.unregister(self.handle)
        self.dc = self.handle = None
        self.is_initialized = False
        self.seen = 0
        self.pending = None

    def reset(self):
        if self.dc is not None:
            for s in range(self.batch):
                self.dc.truncate(s, 0)
        self.seen = 0
        self.pending = None

    def crop(self, max_length):
        raise NotImplementedError("KVQCache.crop: not supported yet (padded rows hold different token counts)")

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("KVQCache: beam search is not supported (use greedy or sampling)")

    def batch_repeat_interleave(self, repeats):
        raise NotImplementedError("KVQCache: batch expansion is not supported; make the batch before prefill")

    def batch_select_indices(self, indices):
        raise NotImplementedError("KVQCache: batch selection is not supported")

    def offload(self):
        pass

    def prefetch(self):
        pass


# transformers versions differ in which methods the mixin declares abstract;
# every one a cache needs is implemented above, with tolerant signatures
KVQLayer.__abstractmethods__ = frozenset()


class KVQCache(Cache):
    """transformers Cache over kvq pages.

    config:        the model's config (only the layer count and the query/KV
                   head ratio are read; head counts come from the tensors)
    k, v:          cache types ("tq3j"/"tq3" default; "f16", "tq4j", ... see `kvq types`)
    max_cache_len: most tokens per batch row (default: config.max_position_embeddings);
                   every layer's page pool is sized for batch x max_cache_len; an append past it
                   raises KvqError "context full"
    seed:          cache seed; layer l uses kvq_seed_derive(seed, l) as the C decoder does
    recent_f16:    keep the last, partly filled page in f16 (default: on for compressed
                   types, as the `kvq` commands do)
    sink_tokens:   also keep the first N tokens in f16
    center_k:      key centering: each full page stores its keys' mean and encodes the keys
                   minus it (default: on with the window, as the `kvq` commands do; needs it)
    prefill:       "sdpa" (default): a prefill chunk into an empty cache attends over
                   itself with SDPA in the model's dtype, then is encoded;
                   "kvq": every chunk is encoded first and its queries attend over the
                   encoded pages causally (kvq_cuda_cache_attend_prefix), exactly what
                   the C decoder computes (used to compare perplexities)
    check_input:   validate appended rows (NaN/Inf; one host sync per layer and step)
    f16_key_layers: layers whose keys are cached in f16 whatever k says; pass
                   key_outlier_layers(model) for checkpoints like Qwen2/2.5, whose
                   first and last layers' k_proj bias dwarfs the others' (what
                   `kvq` does by default, docs/models.md)
    """

    def __init__(self, config, k="tq3j", v="tq3", max_cache_len=None, seed=0, recent_f16=None, sink_tokens=0,
                 prefill="sdpa", check_input=False, f16_key_layers=(), center_k=None):
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        n_layers = int(text.num_hidden_layers)
        if prefill not in ("sdpa", "kvq"):
            raise ValueError(f"KVQCache: prefill must be 'sdpa' or 'kvq', not {prefill!r}")
        self.k, self.v = k, v
        # not "max_cache_len": transformers' Cache has a read-only property of that name
        self.kvq_max_len = int(max_cache_len or getattr(text, "max_position_embeddings", 0) or 4096)
        self.seed = int(seed)
        compressed = _lib.compressed(k) or _lib.compressed(v)
        self.recent_f16 = compressed if recent_f16 is None else bool(recent_f16)
        self.sink_tokens = int(sink_tokens)
        if center_k and not self.recent_f16:
            raise ValueError("KVQCache: center_k needs the recent-token window (recent_f16)")
        self.center_k = self.recent_f16 if center_k is None else bool(center_k)
        self.prefill = prefill
        self.check_input = bool(check_input)
        self.f16_key_layers = frozenset(int(l) for l in f16_key_layers)
        hq = getattr(text, "num_attention_heads", None)
        hkv = getattr(text, "num_key_value_heads", None) or hq
        # the ratio survives tensor parallelism (both counts are split alike)
        self.max_q_per_kv = max(1, hq // hkv) if hq and hkv else 8
        layers = [KVQLayer(self, i) for i in range(n_layers)]
        for kw in ({"layers": layers}, {}):  # transformers versions differ in what Cache() takes
            try:
                super().__init__(**kw)
                break
            except (TypeError, ValueError):
                continue
        self.layers = layers

    # ---- what transformers calls -----------------------------------------
    def _layer(self, layer_idx):
        while len(self.layers) <= layer_idx:
            self.layers.append(KVQLayer(self, len(self.layers)))
        return self.layers[layer_idx]

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        layer = self._layer(layer_idx)
        out = layer.update(key_states, value_states, cache_kwargs)
        attention.set_active(layer)
        return out

    def get_seq_length(self, layer_idx=0, *args, **kwargs):
        if layer_idx is None:
            layer_idx = 0
        return self.layers[layer_idx].seen if layer_idx < len(self.layers) else 0

    def get_query_offset(self, layer_idx=0, *args, **kwargs):
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, query, layer_idx=0, *args, **kwargs):
        q = query if isinstance(query, int) else int(query.shape[0])
        return self.get_seq_length(layer_idx) + q, 0

    def get_max_cache_shape(self, layer_idx=0, *args, **kwargs):
        return -1

    def reset(self):
        for l in self.layers:
            l.reset()

    def crop(self, max_length):
        for l in self.layers:
            l.crop(max_length)

    def reorder_cache(self, beam_idx):
        for l in self.layers:
            l.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats):
        for l in self.layers:
            l.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices):
        for l in self.layers:
            l.batch_select_indices(indices)

    def __len__(self):
        return len(self.layers)

    # ---- kvq extras --------------------------------------------------------
    def kv_bytes(self):
        """Bytes of the pages in use over all layers (what the tokens occupy,
        in whole pages); the f16 window buffers are not counted."""
        return sum(l.bytes_used() for l in self.layers)

    def pool_bytes(self):
        """Device bytes reserved for pages over all layers."""
        return sum(l.dc.bytes_pool() for l in self.layers if l.dc is not None)

    def close(self):
        """Frees every layer's device memory now (otherwise at garbage collection)."""
        for l in self.layers:
            l.free()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# what generate and the mask code read, where this transformers' Cache lacks it
# (where it has it, its version works over the layers above)
for _name, _prop in (("is_compileable", property(lambda self: False)),
                     ("is_sliding", property(lambda self: [False] * len(self.layers))),
                     ("is_initialized", property(lambda self: bool(self.layers) and
                                                 all(l.is_initialized for l in self.layers)))):
    if not hasattr(Cache, _name):
        setattr(KVQCache, _name, _prop)


def key_outlier_layers(model, ratio=8.0):
    """The layers whose self_attn.k_proj bias norm is at least `ratio` x the
    median over layers (kvq's KVQ_KEY_OUTLIER_RATIO, 8): the C decoder keeps
    their keys in f16 (kvq_model_arch.key_outlier_layers). [] for a model
    without k_proj biases or with fewer than 3 layers."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None) or []
    norms = []
    for layer in layers:
        b = getattr(getattr(getattr(layer, "self_attn", None), "k_proj", None), "bias", None)
        if b is None:
            return []
        norms.append(float(b.detach().float().norm()))
    if len(norms) < 3:
        return []
    median = sorted(norms)[(len(norms) - 1) // 2]  # the lower median, as the C side
    return [i for i, n in enumerate(norms) if median > 0 and n >= ratio * median]
