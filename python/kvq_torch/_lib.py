"""ctypes binding of the parts of libkvq this package calls.

Every argtypes/restype below is copied from the public headers
(include/kvq/kvq_status.h, kvq_codec.h, kvq_cache.h, kvq_layout.h,
kvq_cuda.h); the structs mirror the C structs field for field (enums are
C ints). Nothing here imports torch, so the binding and its layout checks run
on a machine without torch or a GPU (tests/test_pure.py).

The library is found, in this order: $KVQ_LIB (a path to libkvq.so), then
libkvq.so / libkvq.so.0 next to this package (kvq_torch/lib/), then the
repository's build/lib/libkvq.so, then the system loader's search path.
"""
import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int, c_size_t, c_uint32, c_uint64,
                    c_void_p)

# enum kvq_status (kvq_status.h); the values are pinned there.
KVQ_OK = 0
KVQ_ERR_INVALID_ARG = 1
KVQ_ERR_UNSUPPORTED = 2
KVQ_ERR_NONFINITE = 3
KVQ_ERR_RANGE = 4
KVQ_ERR_NOMEM = 5
KVQ_ERR_CONTEXT_FULL = 6
KVQ_ERR_BUDGET = 7
KVQ_ERR_NO_DEVICE = 11
KVQ_ERR_DEVICE = 12

# enum kvq_cuda_kernel (kvq_cuda.h)
KVQ_CUDA_KERNEL_AUTO = 0
KVQ_CUDA_KERNEL_FUSED = 1
KVQ_CUDA_KERNEL_REF = 2

# enum kvq_rot_kind (kvq_rotation.h), enum kvq_qjl_kind (kvq_codec.h)
KVQ_ROT_HADAMARD = 0
KVQ_QJL_ORTHO = 0


class CacheConfig(Structure):
    """struct kvq_cache_config (kvq_cache.h)."""
    _fields_ = [
        ("n_kv_heads", c_int),
        ("head_dim", c_int),
        ("type_k", c_int),      # enum kvq_type
        ("type_v", c_int),      # enum kvq_type
        ("seed", c_uint64),
        ("rot", c_int),         # enum kvq_rot_kind
        ("qjl", c_int),         # enum kvq_qjl_kind
        ("page_tokens", c_int),
        ("max_tokens", c_size_t),
        ("max_bytes", c_size_t),
        ("recent_f16", c_int),
        ("sink_tokens", c_int),
        ("center_k", c_int),
    ]


class CudaCacheConfig(Structure):
    """struct kvq_cuda_cache_config (kvq_cuda.h)."""
    _fields_ = [
        ("cache", CacheConfig),
        ("max_seqs", c_int),
        ("pool_pages", c_size_t),
        ("max_q_per_kv", c_int),
        ("check_input", c_int),
    ]


class AttnOpts(Structure):
    """struct kvq_cuda_attn_opts (kvq_cuda.h)."""
    _fields_ = [("kernel", c_int), ("n_splits", c_int)]


class HeadLayout(Structure):
    """struct kvq_head_layout (kvq_layout.h)."""
    _fields_ = [(n, c_uint32) for n in ("type", "dim", "page_tokens", "norm_off", "rnorm_off", "codes_off",
                                        "signs_off", "codes_stride", "signs_stride", "bytes")]


class PageLayout(Structure):
    """struct kvq_page_layout (kvq_layout.h)."""
    _fields_ = [("n_kv_heads", c_uint32), ("page_tokens", c_uint32), ("dim", c_uint32),
                ("k", HeadLayout), ("v", HeadLayout),
                ("k_off", c_uint64), ("v_off", c_uint64), ("page_bytes", c_uint64),
                ("mean_off", c_uint64), ("mean_bytes", c_uint32)]


class KvqError(RuntimeError):
    """A libkvq call returned a status other than KVQ_OK."""

    def __init__(self, what, status, msg):
        super().__init__(f"{what}: {msg} (kvq status {status})")
        self.status = status


# (name, restype, argtypes), exactly as declared in the headers
_SIGNATURES = [
    # kvq_status.h
    ("kvq_status_str", c_char_p, [c_int]),
    # kvq_codec.h
    ("kvq_type_from_name", c_int, [c_char_p, POINTER(c_int)]),
    ("kvq_type_row_bytes", c_size_t, [c_int, c_int]),
    ("kvq_type_bits_per_value", c_double, [c_int, c_int]),
    # kvq_cache.h (the CPU cache: layout checks, byte counts, test references)
    ("kvq_cache_config_default", None, [POINTER(CacheConfig), c_int, c_int, c_size_t]),
    ("kvq_cache_create", c_int, [POINTER(CacheConfig), POINTER(c_void_p)]),
    ("kvq_cache_free", None, [c_void_p]),
    ("kvq_cache_append", c_int, [c_void_p, c_size_t, c_void_p, c_void_p]),
    ("kvq_cache_len", c_size_t, [c_void_p]),
    ("kvq_cache_config_of", POINTER(CacheConfig), [c_void_p]),
    ("kvq_cache_layout", POINTER(PageLayout), [c_void_p]),
    ("kvq_cache_bytes_for", c_size_t, [POINTER(CacheConfig), c_size_t]),
    # kvq_attn.h (the CPU kernel: the reference the device tests compare with)
    ("kvq_attn_workspace_create", c_int, [c_int, c_int, c_size_t, POINTER(c_void_p)]),
    ("kvq_attn_workspace_free", None, [c_void_p]),
    ("kvq_attn_decode", c_int, [c_void_p, c_int, c_size_t, c_void_p, c_int, c_float, c_void_p, c_void_p]),
    # kvq_cuda.h
    ("kvq_cuda_device_count", c_int, []),
    ("kvq_cuda_device_describe", c_int, [c_char_p, c_size_t]),
    ("kvq_cuda_mem_info", c_int, [POINTER(c_size_t), POINTER(c_size_t)]),
    ("kvq_cuda_synchronize", c_int, []),
    ("kvq_cuda_cache_config_default", None, [POINTER(CudaCacheConfig), c_int, c_int, c_size_t, c_int]),
    ("kvq_cuda_cache_create", c_int, [POINTER(CudaCacheConfig), POINTER(c_void_p)]),
    ("kvq_cuda_cache_free", None, [c_void_p]),
    ("kvq_cuda_cache_config_of", POINTER(CudaCacheConfig), [c_void_p]),
    ("kvq_cuda_cache_layout", POINTER(PageLayout), [c_void_p]),
    ("kvq_cuda_cache_set_stream", None, [c_void_p, c_void_p]),
    ("kvq_cuda_cache_len", c_size_t, [c_void_p, c_int]),
    ("kvq_cuda_cache_free_pages", c_size_t, [c_void_p]),
    ("kvq_cuda_cache_truncate", c_int, [c_void_p, c_int, c_size_t]),
    ("kvq_cuda_cache_append", c_int, [c_void_p, c_int, c_size_t, c_void_p, c_void_p]),
    ("kvq_cuda_cache_append_batch", c_int, [c_void_p, c_int, POINTER(c_int), c_void_p, c_void_p]),
    ("kvq_cuda_fast_supported", c_int, [c_void_p, c_int]),
    ("kvq_cuda_cache_attend", c_int,
     [c_void_p, c_int, POINTER(c_int), c_void_p, c_int, c_float, c_void_p, POINTER(AttnOpts)]),
    ("kvq_cuda_cache_attend_prefix", c_int,
     [c_void_p, c_int, POINTER(c_int), POINTER(c_size_t), c_void_p, c_int, c_float, c_void_p, POINTER(AttnOpts)]),
]

_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("KVQ_LIB")
    if env:
        return [env]  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [os.path.join(here, "lib", "libkvq.so"), os.path.join(here, "lib", "libkvq.so.0"),
            os.path.join(repo, "build", "lib", "libkvq.so"), "libkvq.so.0", "libkvq.so"]


def lib():
    """The loaded library with every signature set (loaded once)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, res, args in _SIGNATURES:
            fn = getattr(handle, name)  # AttributeError names a symbol the library lacks
            fn.restype = res
            fn.argtypes = args
        _lib, _lib_path = handle, path
        return _lib
    raise OSError("kvq_torch: cannot load libkvq (set KVQ_LIB to the libkvq.so to use): " + "; ".join(errors))


def lib_path():
    lib()
    return _lib_path


def status_str(st):
    return lib().kvq_status_str(int(st)).decode()


def check(st, what):
    """Raises KvqError naming the call and the library's description of st."""
    if st != KVQ_OK:
        raise KvqError(what, int(st), status_str(st))


def type_from_name(name):
    t = c_int(-1)
    if lib().kvq_type_from_name(name.encode(), ctypes.byref(t)) != KVQ_OK:
        raise ValueError(f"unknown kvq cache type {name!r} (see `kvq types`)")
    return t.value


def compressed(name):
    """Whether cache type `name` is compressed (anything but f32 and f16)."""
    return name not in ("f32", "f16")


def center_for(center_k, recent_f16, type_k):
    """kvq_cache_config.center_k (0/1) of a cache: center_k None is the `kvq`
    commands' default, centred keys where the window is on and the keys are
    compressed."""
    return int(bool(recent_f16 and compressed(type_k)) if center_k is None else bool(center_k))


def row_bytes(type_id, dim):
    return lib().kvq_type_row_bytes(type_id, dim)


def device_count():
    return lib().kvq_cuda_device_count()


def device_describe():
    buf = ctypes.create_string_buffer(256)
    check(lib().kvq_cuda_device_describe(buf, len(buf)), "kvq_cuda_device_describe")
    return buf.value.decode()
