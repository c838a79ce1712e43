"""Bookkeeping that needs neither torch nor a GPU (tested by tests/test_pure.py).

- the per-layer cache seeds the C decoder uses (kvq_seed_derive of kvq_rng.h,
  which is header-only and therefore not exported by libkvq);
- which tokens of a prefill chunk a padded batch row really holds, and the
  attention lengths of their queries;
- bytes per token of a model's KV cache for a pair of cache types.
"""

MASK64 = (1 << 64) - 1


def splitmix64(state):
    """One step of kvq_splitmix64: returns (new_state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def seed_derive(seed, stream):
    """kvq_seed_derive(seed, stream) of include/kvq/kvq_rng.h."""
    st = (seed ^ ((stream * 0xD1B54A32D192ED03) & MASK64)) & MASK64
    st, _ = splitmix64(st)
    _, out = splitmix64(st)
    return out


def layer_seed(seed, layer):
    """The seed of layer `layer`'s cache in the C decoder (decoder/generate/seq.c)."""
    return seed_derive(seed, layer)


def row_entries(len0, valid):
    """A prefill chunk of len(valid) positions for one batch row whose kvq
    sequence holds len0 tokens; valid[i] is False for a padding position.
    Padding is never stored, so the j-th real token of the chunk lands at
    position len0 + j of the sequence and its query attends over the first
    len0 + j + 1 tokens.
    @return (positions, lens): the chunk indices of the real tokens and the
    attention length of each one's query."""
    pos = [i for i, ok in enumerate(valid) if ok]
    return pos, [len0 + j + 1 for j in range(len(pos))]


def is_contiguous_run(pos):
    """True when the chunk indices pos are one run (no gather needed)."""
    return all(b == a + 1 for a, b in zip(pos, pos[1:]))


def kv_bytes_per_token(row_bytes_k, row_bytes_v, n_kv_heads, n_layers):
    """Bytes one token occupies in the packed pages of all layers."""
    return (row_bytes_k + row_bytes_v) * n_kv_heads * n_layers


def pool_pages(max_tokens, page_tokens, max_seqs):
    """Pages a device cache needs for max_seqs sequences of max_tokens each
    (what kvq_cuda_cache_create allocates for pool_pages = 0)."""
    return max_seqs * -(-max_tokens // page_tokens)
