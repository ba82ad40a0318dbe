#!/usr/bin/env python3
"""Write the GGUF dequantization reference kern's CI checks bit for bit.

    python scripts/gen-gguf-quants.py OUT_DIR      # with the pinned gguf package (.venv-cuda)

OUT_DIR/quants.gguf holds one tensor per ggml type kern dequantizes (named like the type:
`Q4_K`, `F16`, ...), each of random raw blocks plus edge blocks: zero scales, every f16 special
(+-inf, quiet and signaling NaN, subnormals, the largest finite, -0) in every scale field, all
nibbles 0 or all set, all bytes 0x00 or 0xFF. OUT_DIR/<TYPE>.npy is gguf-py's own
`gguf.quants.dequantize` of those bytes (float32, row-major [rows, cols]), which
crates/kern-weights/tests/gguf_exact.rs requires kern to reproduce bit for bit. The file also
carries metadata of every value type, nested arrays included, that the test reads back.
The output is deterministic (seeded); OUT_DIR/versions.txt records what produced it.
"""
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

# Byte offsets of the f16 scale fields of each block type (shared/notes/gguf.md §2).
HALF_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}
PLAIN = ["F32", "F16", "BF16"]
SPECIAL_HALVES = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55,
                  0x0001, 0x03FF, 0x8001, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x3555]


def blocks_for(name, rng):
    """Random blocks followed by edge blocks, as a (n_blocks, block_bytes) uint8 array."""
    qtype = Q[name]
    be, bb = GGML_QUANT_SIZES[qtype]
    rand = rng.integers(0, 256, size=(64 if be > 1 else 4096, bb), dtype=np.uint8)
    edges = [np.zeros(bb, np.uint8), np.full(bb, 0xFF, np.uint8)]
    if name in PLAIN:
        specials = [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x00000001,
                    0x807FFFFF, 0x7F7FFFFF, 0x3F808000, 0x3F818000, 0x3F808001, 0x00000000,
                    0x80000000, 0x3F800000]
        if name == "F32":
            vals = np.array(specials, dtype=np.uint32).view(np.uint8)
        else:
            vals = np.array(SPECIAL_HALVES, dtype=np.uint16).view(np.uint8)
        edges += list(vals.reshape(-1, bb))
    else:
        for h in SPECIAL_HALVES:
            for payload in (np.zeros(bb, np.uint8), np.full(bb, 0xFF, np.uint8),
                            np.full(bb, 0x88, np.uint8), rng.integers(0, 256, bb, dtype=np.uint8)):
                b = payload.copy()
                for at in HALF_FIELDS[name]:
                    b[at:at + 2] = np.array([h], np.uint16).view(np.uint8)
                edges.append(b)
            if len(HALF_FIELDS[name]) == 2:
                # A special d with an ordinary min, and the other way round.
                b = rng.integers(0, 256, bb, dtype=np.uint8)
                b[HALF_FIELDS[name][0]:HALF_FIELDS[name][0] + 2] = np.array([h], np.uint16).view(np.uint8)
                b[HALF_FIELDS[name][1]:HALF_FIELDS[name][1] + 2] = np.array([0x3C00], np.uint16).view(np.uint8)
                edges.append(b)
                b = rng.integers(0, 256, bb, dtype=np.uint8)
                b[HALF_FIELDS[name][0]:HALF_FIELDS[name][0] + 2] = np.array([0x3C00], np.uint16).view(np.uint8)
                b[HALF_FIELDS[name][1]:HALF_FIELDS[name][1] + 2] = np.array([h], np.uint16).view(np.uint8)
                edges.append(b)
    blocks = np.concatenate([rand, np.stack(edges)])
    # Rows of 4 blocks (1 element per block for plain types: rows of 64 elements).
    per_row = 4 if be > 1 else 64
    pad = (-len(blocks)) % per_row
    if pad:
        blocks = np.concatenate([blocks, rng.integers(0, 256, size=(pad, bb), dtype=np.uint8)])
    return blocks.reshape(-1, per_row * bb)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240614)
    w = gguf.GGUFWriter(str(out / "quants.gguf.tmp"), arch="kern-test")
    # Metadata of every value type, read back by the Rust test (expected values in meta.json).
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo ✓")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 0.1)
    w.add_array("test.strings", ["a", "", "Ġthe", "<|im_end|>"])
    w.add_array("test.i32s", [1, -2, 3])
    w.add_array("test.nested", [[1, 2], [3]])
    names = []
    for name in PLAIN + list(HALF_FIELDS):
        raw = blocks_for(name, rng)
        qtype = Q[name]
        w.add_tensor(name, raw, raw_dtype=qtype)
        with np.errstate(all="ignore"):  # NaN and inf scales are part of the test
            ref = gguf.quants.dequantize(raw, qtype)
        assert ref.dtype == np.float32, name
        np.save(out / f"{name}.npy", np.ascontiguousarray(ref))
        names.append(name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (out / "quants.gguf.tmp").rename(out / "quants.gguf")
    (out / "meta.json").write_text(json.dumps({"tensors": names}))
    from importlib.metadata import version
    (out / "versions.txt").write_text(f"gguf {version('gguf')}\nnumpy {np.__version__}\n")
    print(f"gen-gguf-quants: wrote {out}/quants.gguf and {len(names)} reference arrays")


if __name__ == "__main__":
    main()
