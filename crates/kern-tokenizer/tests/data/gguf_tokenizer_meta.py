#!/usr/bin/env python3
"""Extract the `tokenizer.*` metadata of a GGUF file (or of its first bytes: the header and the
metadata come first) into a JSON object keyed by GGUF key, for kern-tokenizer's GGUF tests.

    python3 gguf_tokenizer_meta.py FILE.gguf OUT.json

Plain `struct` parsing of GGUF v2/v3 (little-endian), no dependencies. Only the key/value
section is read; tensor infos and data are not needed. Arrays become JSON lists."""
import json, struct, sys

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise SystemExit(f"truncated at byte {self.pos}: need {n} more bytes (is the file a GGUF prefix holding the whole metadata?)")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, t):
        fmt = SCALARS[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar(10)
        return self.take(n).decode("utf-8")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.scalar(4), self.scalar(10)
            return [self.value(et) for _ in range(n)]
        if t not in SCALARS:
            raise SystemExit(f"unknown GGUF value type {t} at byte {self.pos}")
        return self.scalar(t)


def main(path, out):
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the metadata of any tokenizer fits in far less
    r = Reader(data)
    if r.take(4) != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file (magic)")
    version = r.scalar(4)
    if version not in (2, 3):
        raise SystemExit(f"{path}: GGUF version {version}, expected 2 or 3")
    _tensors, kvs = r.scalar(10), r.scalar(10)
    meta = {}
    for _ in range(kvs):
        key = r.string()
        meta[key] = r.value(r.scalar(4))
    keep = {k: v for k, v in meta.items() if k.startswith("tokenizer.") or k == "general.architecture"}
    with open(out, "w") as f:
        json.dump(keep, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{out}: {len(keep)} keys, {len(keep.get('tokenizer.ggml.tokens', []))} tokens, "
          f"{len(keep.get('tokenizer.ggml.merges', []))} merges")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
