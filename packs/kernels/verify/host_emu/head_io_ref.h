// Reference side of packs/kernels/head_io.cuh's per-head RMSNorm (rope.cu's qk_norm_rope and
// gated.cu share it): the sum of squares of one head in the kernel's order — each of the 32 lanes
// its E = D / 32 consecutive elements, then the xor butterfly 16, 8, 4, 2, 1 — for rope_emu.cpp
// and gated_emu.cpp.
#pragma once
#include <cstring>

inline float head_sum_squares(const float* x, int D) {
    const int E = D / 32;
    float lane[32];
    for (int l = 0; l < 32; ++l) {
        float ss = 0.f;
        for (int j = 0; j < E; ++j) ss += x[l * E + j] * x[l * E + j];
        lane[l] = ss;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float nx[32];
        for (int l = 0; l < 32; ++l) nx[l] = lane[l] + lane[l ^ o];
        std::memcpy(lane, nx, sizeof lane);
    }
    return lane[0];
}
