"""Checks of kvq_torch that need neither torch nor a GPU: the ctypes structs
against the C compiler's own layout, the Python kvq_seed_derive against the
C one, the binding against a CPU libkvq.so, and the pure bookkeeping.

Needs libkvq.so (KVQ_LIB, or the repository's build/lib) and, for the layout
comparison, a C compiler; skips with one line when either is missing."""
import ctypes
import os
import shutil
import subprocess
import tempfile

from runner import Skip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

C_PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "kvq_cuda.h"
#include "kvq_rng.h"
#define OFF(T, f) printf(#T "." #f " %zu\n", offsetof(struct T, f))
int main(void)
{
    printf("sizeof.kvq_cache_config %zu\n", sizeof(struct kvq_cache_config));
    OFF(kvq_cache_config, n_kv_heads); OFF(kvq_cache_config, head_dim); OFF(kvq_cache_config, type_k);
    OFF(kvq_cache_config, type_v); OFF(kvq_cache_config, seed); OFF(kvq_cache_config, rot);
    OFF(kvq_cache_config, qjl); OFF(kvq_cache_config, page_tokens); OFF(kvq_cache_config, max_tokens);
    OFF(kvq_cache_config, max_bytes); OFF(kvq_cache_config, recent_f16); OFF(kvq_cache_config, sink_tokens);
    printf("sizeof.kvq_cuda_cache_config %zu\n", sizeof(struct kvq_cuda_cache_config));
    OFF(kvq_cuda_cache_config, cache); OFF(kvq_cuda_cache_config, max_seqs); OFF(kvq_cuda_cache_config, pool_pages);
    OFF(kvq_cuda_cache_config, max_q_per_kv); OFF(kvq_cuda_cache_config, check_input);
    printf("sizeof.kvq_cuda_attn_opts %zu\n", sizeof(struct kvq_cuda_attn_opts));
    OFF(kvq_cuda_attn_opts, kernel); OFF(kvq_cuda_attn_opts, n_splits);
    printf("sizeof.kvq_page_layout %zu\n", sizeof(struct kvq_page_layout));
    OFF(kvq_page_layout, k); OFF(kvq_page_layout, v); OFF(kvq_page_layout, k_off); OFF(kvq_page_layout, v_off);
    OFF(kvq_page_layout, page_bytes);
    printf("sizeof.kvq_head_layout %zu\n", sizeof(struct kvq_head_layout));
    printf("sizeof.enum %zu\n", sizeof(enum kvq_type));
    unsigned long long seeds[] = {0, 1, 12345, 0xffffffffffffffffull};
    for (int i = 0; i < 4; i++)
        for (unsigned long long s = 0; s < 5; s++)
            printf("derive.%llu.%llu %llu\n", seeds[i], s, (unsigned long long)kvq_seed_derive(seeds[i], s));
    struct kvq_cuda_cache_config c;
    kvq_cuda_cache_config_default(&c, 8, 128, 131072, 3);
    printf("cfg.n_kv_heads %d\ncfg.head_dim %d\ncfg.type_k %d\ncfg.type_v %d\ncfg.seed %llu\ncfg.rot %d\n"
           "cfg.qjl %d\ncfg.page_tokens %d\ncfg.max_tokens %zu\ncfg.max_bytes %zu\ncfg.recent_f16 %d\n"
           "cfg.sink_tokens %d\ncfg.max_seqs %d\ncfg.pool_pages %zu\ncfg.max_q_per_kv %d\ncfg.check_input %d\n",
           c.cache.n_kv_heads, c.cache.head_dim, (int)c.cache.type_k, (int)c.cache.type_v,
           (unsigned long long)c.cache.seed, (int)c.cache.rot, (int)c.cache.qjl, c.cache.page_tokens,
           c.cache.max_tokens, c.cache.max_bytes, c.cache.recent_f16, c.cache.sink_tokens, c.max_seqs,
           c.pool_pages, c.max_q_per_kv, c.check_input);
    return 0;
}
"""


def _lib_or_skip():
    from kvq_torch import _lib
    try:
        _lib.lib()
    except OSError as e:
        raise Skip(f"no libkvq.so to load ({e}); build it (make) or set KVQ_LIB")
    return _lib


_probe_cache = {}


def _probe():
    """name -> int printed by C_PROBE, compiled against include/kvq and the loaded library."""
    if "out" in _probe_cache:
        return _probe_cache["out"]
    _lib = _lib_or_skip()
    cc = shutil.which(os.environ.get("CC", "cc"))
    inc = os.path.join(REPO, "include", "kvq")
    if not cc or not os.path.isdir(inc):
        raise Skip("no C compiler or no include/kvq: the layout comparison needs both")
    path = os.path.realpath(_lib.lib_path())
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "probe.c"), os.path.join(d, "probe")
        with open(src, "w") as f:
            f.write(C_PROBE)
        subprocess.run([cc, "-std=c11", "-I", inc, src, path, "-Wl,-rpath," + os.path.dirname(path), "-lm",
                        "-o", exe], check=True, capture_output=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    vals = {}
    for line in out.splitlines():
        k, v = line.split()
        vals[k] = int(v)
    _probe_cache["out"] = vals
    return vals


def test_struct_layouts_match_c():
    _lib = _lib_or_skip()
    p = _probe()
    checked = 0
    for cname, cls in (("kvq_cache_config", _lib.CacheConfig), ("kvq_cuda_cache_config", _lib.CudaCacheConfig),
                       ("kvq_cuda_attn_opts", _lib.AttnOpts), ("kvq_page_layout", _lib.PageLayout)):
        assert ctypes.sizeof(cls) == p[f"sizeof.{cname}"], f"sizeof {cname}: ctypes {ctypes.sizeof(cls)}, C {p[f'sizeof.{cname}']}"
        for name, _ in cls._fields_:
            key = f"{cname}.{name}"
            if key in p:
                off = getattr(cls, name).offset
                assert off == p[key], f"offsetof {key}: ctypes {off}, C {p[key]}"
                checked += 1
    assert ctypes.sizeof(_lib.HeadLayout) == p["sizeof.kvq_head_layout"]
    assert p["sizeof.enum"] == ctypes.sizeof(ctypes.c_int), "enums are not int-sized on this compiler"
    return f"{checked} field offsets and 5 struct sizes equal"


def test_seed_derive_matches_c():
    from kvq_torch.plan import seed_derive
    p = _probe()
    n = 0
    for key, want in p.items():
        if key.startswith("derive."):
            _, seed, stream = key.split(".")
            got = seed_derive(int(seed), int(stream))
            assert got == want, f"kvq_seed_derive({seed}, {stream}): python {got}, C {want}"
            n += 1
    assert n == 20
    return f"{n} values equal"


def test_cuda_config_default_through_ctypes():
    _lib = _lib_or_skip()
    p = _probe()
    cfg = _lib.CudaCacheConfig()
    _lib.lib().kvq_cuda_cache_config_default(ctypes.byref(cfg), 8, 128, 131072, 3)
    got = {"n_kv_heads": cfg.cache.n_kv_heads, "head_dim": cfg.cache.head_dim, "type_k": cfg.cache.type_k,
           "type_v": cfg.cache.type_v, "seed": cfg.cache.seed, "rot": cfg.cache.rot, "qjl": cfg.cache.qjl,
           "page_tokens": cfg.cache.page_tokens, "max_tokens": cfg.cache.max_tokens,
           "max_bytes": cfg.cache.max_bytes, "recent_f16": cfg.cache.recent_f16,
           "sink_tokens": cfg.cache.sink_tokens, "max_seqs": cfg.max_seqs, "pool_pages": cfg.pool_pages,
           "max_q_per_kv": cfg.max_q_per_kv, "check_input": cfg.check_input}
    for k, v in got.items():
        assert v == p["cfg." + k], f"{k}: ctypes read {v}, C wrote {p['cfg.' + k]}"
    assert got["type_k"] == _lib.type_from_name("tq3j") and got["type_v"] == _lib.type_from_name("tq3")
    return "16 fields read back as C wrote them"


def test_types_and_errors():
    _lib = _lib_or_skip()
    # row sizes from the row formats of kvq_codec.h at d = 128: tq3j = 2 (norm) + 2 (gamma) + 48 (codes)
    # + 16 (signs); tq3 = 2 + 48; f16 = 256
    assert _lib.row_bytes(_lib.type_from_name("tq3j"), 128) == 68
    assert _lib.row_bytes(_lib.type_from_name("tq3"), 128) == 50
    assert _lib.row_bytes(_lib.type_from_name("f16"), 128) == 256
    try:
        _lib.type_from_name("tq9")
        raise AssertionError("an unknown type name was accepted")
    except ValueError as e:
        assert "tq9" in str(e)
    assert _lib.status_str(_lib.KVQ_ERR_NO_DEVICE) == _lib.lib().kvq_status_str(11).decode()
    try:
        _lib.check(_lib.KVQ_ERR_BUDGET, "kvq_something")
        raise AssertionError("check() let an error status through")
    except _lib.KvqError as e:
        assert e.status == _lib.KVQ_ERR_BUDGET and "kvq_something" in str(e) and _lib.status_str(7) in str(e)
    return "row bytes 68/50/256, unknown names refused, statuses raise with the library's text"


def test_no_device_is_a_clear_error():
    _lib = _lib_or_skip()
    if _lib.device_count() > 0:
        raise Skip("a GPU is present: the no-device contract is not observable here")
    from kvq_torch.device_cache import DeviceCache
    try:
        DeviceCache(8, 128, 1024, 2)
        raise AssertionError("a device cache was created without a device")
    except _lib.KvqError as e:
        assert e.status == _lib.KVQ_ERR_NO_DEVICE, str(e)
        assert "kvq_cuda_cache_create" in str(e)
        return f"raised: {e}"


def test_host_cache_round_trip():
    _lib = _lib_or_skip()
    from kvq_torch.host_cache import HostCache
    import math
    H, D, T = 2, 128, 70
    hc = HostCache(H, D, 256, "tq3j", "tq3", seed=5)
    FA = ctypes.c_float * (T * H * D)
    k = FA(*[math.sin(0.37 * i) for i in range(T * H * D)])
    v = FA(*[math.cos(0.11 * i) for i in range(T * H * D)])
    hc.append(T, ctypes.addressof(k), ctypes.addressof(v))
    assert hc.length() == T
    lay = hc.layout()
    assert lay.page_tokens == 64 and lay.n_kv_heads == H and lay.dim == D
    # a page holds 64 tokens of each head's K (68 B) and V (50 B) rows; sections are padded to 16 bytes
    assert lay.page_bytes >= 64 * H * (68 + 50) and lay.page_bytes % 16 == 0
    q = (ctypes.c_float * (2 * D))(*[math.sin(0.37 * (j + i)) for j in range(2) for i in range(D)])
    out = (ctypes.c_float * (2 * D))()
    hc.decode(1, T, ctypes.addressof(q), 2, 1.0 / math.sqrt(D), ctypes.addressof(out))
    assert all(math.isfinite(x) for x in out) and any(x != 0 for x in out)
    # attention output is a convex combination of (decoded) values: bounded by their largest norm
    assert max(abs(x) for x in out) <= 1.5
    try:
        hc.decode(2, T, ctypes.addressof(q), 2, 0.1, ctypes.addressof(out))
        raise AssertionError("a bad KV head was accepted")
    except _lib.KvqError as e:
        assert e.status == _lib.KVQ_ERR_INVALID_ARG
    hc.close()
    return f"{T} tokens appended, page {lay.page_bytes} B, decode ok, bad head refused"


def test_plan_bookkeeping():
    from kvq_torch import plan
    assert plan.row_entries(0, [True] * 4) == ([0, 1, 2, 3], [1, 2, 3, 4])
    # left padding: two pads, the real tokens land at 10, 11, 12 of a sequence holding 10
    assert plan.row_entries(10, [False, False, True, True, True]) == ([2, 3, 4], [11, 12, 13])
    assert plan.row_entries(3, [False, False]) == ([], [])
    assert plan.is_contiguous_run([2, 3, 4]) and not plan.is_contiguous_run([1, 3])
    assert plan.pool_pages(131072, 64, 1) == 2048 and plan.pool_pages(65, 64, 3) == 6
    # Llama-3.1-8B: 32 layers, 8 KV heads, tq3j+tq3 = 68+50 bytes per head and token
    assert plan.kv_bytes_per_token(68, 50, 8, 32) == 30208
    assert plan.kv_bytes_per_token(256, 256, 8, 32) == 131072
    return "row entries, pool pages, bytes per token"


def test_package_imports_without_torch():
    import importlib
    import sys
    for m in ("kvq_torch", "kvq_torch._lib", "kvq_torch.plan", "kvq_torch.host_cache", "kvq_torch.device_cache"):
        importlib.import_module(m)
    if "torch" in sys.modules:
        return "imported (torch is installed here, so its absence was not tested)"
    return "kvq_torch, _lib, plan, host_cache, device_cache import without torch"


def test_package_imports_with_an_unusable_torch():
    # A torch without torch.library (or whose custom ops fail to register) must
    # leave the pure parts importable; the lazy attributes once recursed
    # without end here (`from . import ops` asks the package's __getattr__).
    import os
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as stub:
        for mod in ("torch", "transformers"):
            os.makedirs(os.path.join(stub, mod))
            open(os.path.join(stub, mod, "__init__.py"), "w").close()
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([stub, pkg]))
        code = ("import kvq_torch, kvq_torch.plan\n"
                "try:\n    kvq_torch.ops\nexcept AttributeError as e:\n    print('ops:', e)\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "import with a stub torch failed: " + (r.stderr.strip().splitlines() or ["?"])[-1]
        assert "library" in r.stdout, "kvq_torch.ops with a stub torch: " + r.stdout.strip()
    return "kvq_torch imports with a torch lacking torch.library; kvq_torch.ops names what is missing"


TESTS = [test_struct_layouts_match_c, test_seed_derive_matches_c, test_cuda_config_default_through_ctypes,
         test_types_and_errors, test_no_device_is_a_clear_error, test_host_cache_round_trip,
         test_plan_bookkeeping, test_package_imports_without_torch, test_package_imports_with_an_unusable_torch]
