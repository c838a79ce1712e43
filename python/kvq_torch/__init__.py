"""kvq for PyTorch: kvq's compressed KV cache as torch ops and a Hugging Face
transformers cache + attention backend. See docs/pytorch.md.

    import kvq_torch
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="kvq", ...)
    model.generate(ids, past_key_values=kvq_torch.KVQCache(model.config, k="tq3j", v="tq3"))

Needs libkvq.so built with CUDA ($KVQ_LIB or kvq_torch/lib/), torch and, for
KVQCache, transformers. kvq_torch._lib and kvq_torch.plan import without
either.
"""
from . import _lib, plan  # noqa: F401

__all__ = ["KVQCache", "DeviceCache", "register", "use_kvq", "kvq_attention_forward"]


def __getattr__(name):
    # torch/transformers load only when asked for, so the pure parts stay usable without them
    if name == "DeviceCache":
        from .device_cache import DeviceCache
        return DeviceCache
    if name == "KVQCache":
        from .cache import KVQCache
        _register_once()
        return KVQCache
    if name in ("register", "use_kvq", "kvq_attention_forward"):
        from . import attention
        _register_once()
        return getattr(attention, name)
    if name == "ops":
        from . import ops
        return ops
    raise AttributeError(name)


_registered = False


def _register_once():
    global _registered
    if not _registered:
        from . import attention
        attention.register("kvq")
        _registered = True


try:  # with torch and transformers present, attn_implementation="kvq" works right after import
    import torch  # noqa: F401
    import transformers  # noqa: F401
    _register_once()
except (ImportError, AttributeError):
    pass  # no torch/transformers, or a torch without torch.library.custom_op: the pure parts still work
