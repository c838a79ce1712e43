"""kvq for PyTorch: kvq's compressed KV cache as torch ops and a Hugging Face
transformers cache + attention backend. See docs/pytorch.md.

    import kvq_torch
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="kvq", ...)
    model.generate(ids, past_key_values=kvq_torch.KVQCache(model.config, k="tq3j", v="tq3"))

Needs libkvq.so built with CUDA ($KVQ_LIB or kvq_torch/lib/), torch and, for
KVQCache, transformers. kvq_torch._lib and kvq_torch.plan import without
either.
"""
import importlib

from . import _lib, plan  # noqa: F401

__all__ = ["KVQCache", "DeviceCache", "register", "use_kvq", "kvq_attention_forward", "key_outlier_layers"]


def __getattr__(name):
    # torch/transformers load only when asked for, so the pure parts stay usable without them
    # import_module, not `from . import x`: the latter asks this very hook for
    # x before importing it, which recursed without end for "ops".
    if name == "DeviceCache":
        return _sub("device_cache").DeviceCache
    if name in ("KVQCache", "key_outlier_layers"):
        cache = _sub("cache")
        _register_once()
        return getattr(cache, name)
    if name in ("register", "use_kvq", "kvq_attention_forward"):
        attention = _sub("attention")
        _register_once()
        return getattr(attention, name)
    if name == "ops":
        return _sub("ops")
    raise AttributeError(name)


def _sub(name):
    return importlib.import_module("." + name, __name__)


_registered = False


def _register_once():
    global _registered
    if not _registered:
        _sub("attention").register("kvq")
        _registered = True


try:  # with torch and transformers present, attn_implementation="kvq" works right after import
    import torch  # noqa: F401
    import transformers  # noqa: F401
    _register_once()
except (ImportError, AttributeError):
    pass  # no torch/transformers, or a torch without torch.library.custom_op: the pure parts still work
