"""examples/perseq's rule, as its kernel computes it: the next token of a context is a hash of
the running sum of its token ids and its length (perseq.py and perseq_snapshots.py check every
generated token against it)."""


def rule(ctx):
    acc = sum(ctx) % 2**32
    return ((acc * 2654435761 + len(ctx) * 40503) % 2**32) % 1000
