// A toy model with a per-sequence state, for kern's per-sequence slots (examples/perseq).
//
// state[slot] holds the sum (mod 2^32) of every token id of the sequence so far. A step's chunk
// of a sequence adds its tokens — starting from 0 when the chunk begins at position 0, else from
// the slot's value — and the next token is a hash of that sum and the sequence length. A
// sequence given another's slot, or a slot not reset, produces different tokens, so a test
// that knows the rule (scripts/gpu/perseq.py) sees any slot mix-up. The per-token state `kv`
// stores each token id at its slot (slot_mapping), as a KV cache would.
extern "C" __global__ void running_sum(const int* token_ids, const int* positions, const int* query_start,
                                       const int* slot_mapping, const int* seq_slots, unsigned int* state,
                                       int* kv, int* sampled, int vocab, int seqs, int tokens) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < tokens && slot_mapping[t] >= 0) kv[slot_mapping[t]] = token_ids[t];
    if (t >= seqs) return;
    int slot = seq_slots[t];
    int a = query_start[t], b = query_start[t + 1];
    if (slot < 0 || a >= b) return;  // a padded row
    unsigned int acc = positions[a] == 0 ? 0u : state[slot];
    for (int i = a; i < b; i++) acc += (unsigned int)token_ids[i];
    state[slot] = acc;
    unsigned int len = (unsigned int)positions[b - 1] + 1u;
    sampled[t] = (int)((acc * 2654435761u + len * 40503u) % (unsigned int)vocab);
}
