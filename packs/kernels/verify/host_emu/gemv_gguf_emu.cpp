// Runs packs/kernels/gemv_gguf.cu (the GGUF-native decode GEMVs gemv_<t> / gemv_<t>_f32out and the
// dequant_<t>_bf16 kernels, t = q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k) on the CPU (emu.h)
// against references written here from gguf-py's quants.py formulas (independent of the kernels'
// code):
//   known answers  the reference dequantization reproduces gguf-py's own float32 output bit for bit
//                  (scripts/gen-gguf-quants.py's quants.gguf + <TYPE>.npy: random blocks and edge
//                  blocks with every f16 special, NaN payloads included), and dequant_<t>_bf16 gives
//                  exactly those values rounded to bf16 (the `half` crate's rounding, NaN included),
//                  written at a row offset (guard rows untouched). Missing data is SKIPPED, or a
//                  FAILURE with KERN_REQUIRE_TEST_DATA=1 (scripts/test.sh sets it).
//   dequant        random blocks with finite scales: dequant_<t>_bf16 == bf16(reference).
//   gemv           both families (gemv_<t>: 4 warps; gemv_<t>_w8: 8 warps), random blocks and bf16 x: f32out within (K/16 + 16)·2^-22 of Σ|x|·(|d·sc·q| + |min|)
//                  of an fp64 reference (+ bias); the bf16 entry equals bf16(f32out) bit for bit;
//                  batch invariance (a row's bits for M = 1, 3, 8 and the second pass of M = 11 are
//                  the same); ldy / col0 (three types into one fused row buffer, like a Q4_K_M qkv);
//                  nothing outside the written block changes.
// Checks the kernels' indexing, fragments and arithmetic order; mma.sync is emu.h's (fp32 sums in
// double, rounded once), so the GPU's bits are checked by packs/kernels/verify/gguf_verify.py.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "emu_math.h"
#include "../../gemv_gguf.cu"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdlib>
#include <map>
#include <random>
#include <stdexcept>
#include <string>

namespace {

// ------------------------------------------------------------------ types
struct TypeInfo {
  const char* name;  // ggml name (tensor name in quants.gguf, <name>.npy)
  const char* kern;  // entry suffix
  int be, bb;
  std::vector<int> halves;  // byte offsets of the f16 fields
};
const std::vector<TypeInfo> TYPES = {
    {"Q4_0", "q4_0", 32, 18, {0}},     {"Q4_1", "q4_1", 32, 20, {0, 2}},  {"Q5_0", "q5_0", 32, 22, {0}},
    {"Q5_1", "q5_1", 32, 24, {0, 2}},  {"Q8_0", "q8_0", 32, 34, {0}},     {"Q2_K", "q2_k", 256, 84, {80, 82}},
    {"Q3_K", "q3_k", 256, 110, {108}}, {"Q4_K", "q4_k", 256, 144, {0, 2}}, {"Q5_K", "q5_k", 256, 176, {0, 2}},
    {"Q6_K", "q6_k", 256, 210, {208}},
};

typedef void (*GemvBf16)(const __nv_bfloat16*, const unsigned char*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int, int, int);
typedef void (*GemvF32)(const __nv_bfloat16*, const unsigned char*, const __nv_bfloat16*, float*, int, int, int, int, int);
typedef void (*Dequant)(const unsigned char*, __nv_bfloat16*, int, int, int);
struct Entries {
  GemvBf16 gemv, gemv_w8;
  GemvF32 gemv_f32, gemv_w8_f32;
  Dequant deq;
};
#define KGGUF_E(t) {#t, {gemv_##t, gemv_##t##_w8, gemv_##t##_f32out, gemv_##t##_w8_f32out, dequant_##t##_bf16}}
const std::map<std::string, Entries> ENTRY = {KGGUF_E(q4_0), KGGUF_E(q4_1), KGGUF_E(q5_0), KGGUF_E(q5_1), KGGUF_E(q8_0),
                                              KGGUF_E(q2_k), KGGUF_E(q3_k), KGGUF_E(q4_k), KGGUF_E(q5_k), KGGUF_E(q6_k)};
int g_warps = 4;  // the family the GEMV cases launch: gemv_<t> (4 warps) or gemv_<t>_w8 (8)

// ------------------------------------------------------------------ reference (gguf-py quants.py)
uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// numpy's npy_halfbits_to_floatbits (astype(float32) of a float16): exact, NaN payload kept.
float half_to_float(uint16_t h) {
  const uint32_t sgn = (uint32_t)(h & 0x8000u) << 16;
  uint32_t hexp = h & 0x7c00u;
  if (hexp == 0) {
    uint32_t sig = h & 0x03ffu;
    if (sig == 0) return bitsf(sgn);
    sig <<= 1;
    while ((sig & 0x0400u) == 0) {
      sig <<= 1;
      ++hexp;
    }
    return bitsf(sgn + ((uint32_t)(127 - 15 - hexp) << 23) + ((sig & 0x03ffu) << 13));
  }
  if (hexp == 0x7c00u) return bitsf(sgn + 0x7f800000u + ((uint32_t)(h & 0x03ffu) << 13));
  return bitsf(sgn + (((uint32_t)(h & 0x7fffu) + 0x1c000u) << 13));
}
// the half crate's bf16::from_f32
uint16_t to_bf16(float f) {
  const uint32_t x = fbits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  const uint32_t r = 0x8000u;
  if ((x & r) && (x & (3 * r - 1))) return (uint16_t)((x >> 16) + 1);
  return (uint16_t)(x >> 16);
}
float bf16f(uint16_t b) { return bitsf((uint32_t)b << 16); }
uint16_t hf(const uint8_t* p) { return (uint16_t)(p[0] | p[1] << 8); }

// One block → be floats (out) and, per element, |first term| + |second term| (mag) of the formula
// (x = a + b or a − b), for the GEMV error bound. Native f32 arithmetic in quants.py's order.
void ref_block(const std::string& t, const uint8_t* b, float* out, float* mag) {
  auto put = [&](int e, float a) {  // x = a
    out[e] = a;
    if (mag) mag[e] = std::fabs(a);
  };
  auto put2 = [&](int e, float a, float b, bool minus) {  // x = a + b or a - b
    out[e] = minus ? a - b : a + b;
    if (mag) mag[e] = std::fabs(a) + std::fabs(b);
  };
  if (t == "Q4_0" || t == "Q4_1" || t == "Q5_0" || t == "Q5_1") {
    const bool m1 = t[3] == '1', q5 = t[1] == '5';
    const float d = half_to_float(hf(b)), m = m1 ? half_to_float(hf(b + 2)) : 0.f;
    const int qho = m1 ? 4 : 2, qso = qho + (q5 ? 4 : 0);
    const uint32_t qh = q5 ? (uint32_t)(b[qho] | b[qho + 1] << 8 | b[qho + 2] << 16 | (uint32_t)b[qho + 3] << 24) : 0u;
    for (int e = 0; e < 32; ++e) {
      int q = (e < 16 ? b[qso + e] : b[qso + e - 16] >> 4) & 15;
      if (q5) q |= (int)((qh >> e) & 1u) << 4;
      if (m1) put2(e, d * (float)q, m, false);
      else put(e, d * (float)(int8_t)(q - (q5 ? 16 : 8)));
    }
  } else if (t == "Q8_0") {
    const float d = half_to_float(hf(b));
    for (int e = 0; e < 32; ++e) put(e, (float)(int8_t)b[2 + e] * d);
  } else if (t == "Q2_K") {
    const float d = half_to_float(hf(b + 80)), dmin = half_to_float(hf(b + 82));
    for (int e = 0; e < 256; ++e) {
      const int j = e / 16, half = e / 128, sh = (e % 128) / 32, l = e % 32;
      const float dl = d * (float)(b[j] & 0xF), ml = dmin * (float)(b[j] >> 4);
      put2(e, dl * (float)((b[16 + 32 * half + l] >> (2 * sh)) & 3), ml, true);
    }
  } else if (t == "Q3_K") {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    const float d = half_to_float(hf(b + 108));
    for (int e = 0; e < 256; ++e) {
      const int j = e / 16;
      const int ls = (sc[j % 8] >> (4 * (j / 8))) & 0x0F;  // lscales: [8 bytes >> 0 | 8 bytes >> 4]
      const int hs = (sc[8 + j % 4] >> (2 * (j / 4))) & 0x03;
      const float s = (float)(int8_t)((int8_t)(ls | hs << 4) - 32);
      const float dl = d * s;
      const int half = e / 128, sh = (e % 128) / 32, l = e % 32;
      const int ql = (qs[32 * half + l] >> (2 * sh)) & 3;
      const int qh = ((hm[l] >> (e / 32)) & 1) ^ 1;
      put(e, dl * (float)(int8_t)(ql - (qh << 2)));
    }
  } else if (t == "Q4_K" || t == "Q5_K") {
    const float d = half_to_float(hf(b)), dmin = half_to_float(hf(b + 2));
    const uint8_t* s = b + 4;  // [d-row 0..3 | m-row 4..7 | m_d-row 8..11]
    int scv[8], mv[8];
    for (int i = 0; i < 4; ++i) {
      scv[i] = s[i] & 0x3F;
      scv[4 + i] = (s[8 + i] & 0x0F) | ((s[i] >> 2) & 0x30);
      mv[i] = s[4 + i] & 0x3F;
      mv[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
    const bool q5 = t == "Q5_K";
    const uint8_t *qh = b + 16, *qs = b + (q5 ? 48 : 16);
    for (int e = 0; e < 256; ++e) {
      const int k = e / 32, l = e % 32;
      int q = (qs[32 * (k / 2) + l] >> (4 * (k % 2))) & 0x0F;
      if (q5) q |= ((qh[l] >> k) & 1) << 4;
      const float dk = d * (float)scv[k], dm = dmin * (float)mv[k];
      put2(e, dk * (float)q, dm, true);
    }
  } else if (t == "Q6_K") {
    const uint8_t *ql = b, *qh = b + 128;
    const float d = half_to_float(hf(b + 208));
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, r = e % 128;  // ql: (2, 2 nibbles, 64); qh: (2, 4 shifts, 32)
      const int nib = r / 64, lq = r % 64, k = r / 32, l = r % 32;
      const int lo = (ql[64 * half + lq] >> (4 * nib)) & 0x0F;
      const int hi = (qh[32 * half + l] >> (2 * k)) & 0x03;
      const float dl = d * (float)(int8_t)b[192 + e / 16];
      put(e, dl * (float)(int8_t)((int8_t)(lo | hi << 4) - 32));
    }
  } else {
    std::fprintf(stderr, "no reference for %s\n", t.c_str());
    std::abort();
  }
}

// ------------------------------------------------------------------ harness
template <class T>
struct Buf {  // 64-byte aligned, like device allocations
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t n_) : n(n_) { p = static_cast<T*>(std::aligned_alloc(64, ((n * sizeof(T) + 63) / 64) * 64 + 64)); }
  Buf(const Buf&) = delete;
  ~Buf() { std::free(p); }
  T& operator[](size_t i) { return p[i]; }
  const T& operator[](size_t i) const { return p[i]; }
};

int fails = 0, passes = 0, skips = 0;
void report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  (ok ? passes : fails)++;
}
std::string fmt(const char* f, ...) {
  char b[512];
  va_list a;
  va_start(a, f);
  std::vsnprintf(b, sizeof b, f, a);
  va_end(a);
  return b;
}

std::mt19937_64 rng(20261203);
uint16_t rand_half(int emin, int emax, bool neg_ok) {  // a normal f16 with exponent 2^emin .. 2^emax
  const int e = emin + (int)(rng() % (uint64_t)(emax - emin + 1));
  const uint16_t s = (neg_ok && (rng() & 1)) ? 0x8000u : 0u;
  return (uint16_t)(s | (uint16_t)((e + 15) << 10) | (uint16_t)(rng() & 0x3ffu));
}
// Random blocks with finite, moderate f16 fields (d ~ 2^-9 .. 2^-6; mins of either sign).
std::vector<uint8_t> rand_blocks(const TypeInfo& ty, size_t nblocks) {
  std::vector<uint8_t> v(nblocks * ty.bb);
  for (auto& c : v) c = (uint8_t)rng();
  for (size_t b = 0; b < nblocks; ++b)
    for (size_t i = 0; i < ty.halves.size(); ++i) {
      const bool is_min = i == 1 && (ty.name[1] == '4' || ty.name[1] == '5');  // Q4_1 / Q5_1 m may be negative
      const uint16_t h = rand_half(-9, -6, is_min || (i == 0 && ty.be == 32 && ty.name[3] != '1'));
      v[b * ty.bb + ty.halves[i]] = (uint8_t)h;
      v[b * ty.bb + ty.halves[i] + 1] = (uint8_t)(h >> 8);
    }
  return v;
}
void ref_matrix(const TypeInfo& ty, const uint8_t* W, int N, int K, std::vector<float>& w, std::vector<float>* mag) {
  w.assign((size_t)N * K, 0.f);
  if (mag) mag->assign((size_t)N * K, 0.f);
  const size_t nb = (size_t)N * K / ty.be;
  for (size_t b = 0; b < nb; ++b)
    ref_block(ty.name, W + b * ty.bb, &w[b * ty.be], mag ? &(*mag)[b * ty.be] : nullptr);
}

// dequant_<t>_bf16 at row offset row0 of a [row0 + N + 2, K] matrix: rows row0 .. row0+N-1 must
// equal bf16(ref) (bits), the others keep their poison.
bool run_dequant(const TypeInfo& ty, const uint8_t* W, int N, int K, const std::vector<float>& ref, int row0, std::string& why) {
  const size_t rows = (size_t)row0 + N + 2;
  Buf<uint16_t> dst(rows * K);
  for (size_t i = 0; i < rows * (size_t)K; ++i) dst[i] = 0x7fc1;
  Buf<uint8_t> w((size_t)N * K / ty.be * ty.bb);
  std::memcpy(w.p, W, w.n);
  const auto f = ENTRY.at(ty.kern).deq;
  const long long total8 = (long long)N * K / 8;
  emu_launch({(unsigned)((total8 + 255) / 256), 1, 1}, 256,
             [&] { f(w.p, reinterpret_cast<__nv_bfloat16*>(dst.p), N, K, row0); });
  size_t bad = 0, first = 0;
  for (size_t r = 0; r < rows; ++r)
    for (int k = 0; k < K; ++k) {
      const bool inside = r >= (size_t)row0 && r < (size_t)row0 + N;
      const uint16_t want = inside ? to_bf16(ref[(r - row0) * K + k]) : (uint16_t)0x7fc1;
      if (dst[r * K + k] != want && bad++ == 0) first = r * K + k;
    }
  if (bad) why = fmt(" (%zu differ; first at row %zu col %zu: %04x, want %04x)", bad, first / K, first % K, dst[first],
                     (first / K >= (size_t)row0 && first / K < (size_t)row0 + N) ? to_bf16(ref[(first / K - row0) * K + first % K]) : 0x7fc1);
  return bad == 0;
}

// ------------------------------------------------------------------ known answers (gen-gguf-quants.py)
std::string repo_root() {
  std::string f = __FILE__;  // .../packs/kernels/verify/host_emu/gemv_gguf_emu.cpp
  for (int i = 0; i < 5; ++i) f = f.substr(0, f.find_last_of('/'));
  return f;
}
bool read_file(const std::string& path, std::vector<uint8_t>& out) {
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) return false;
  std::fseek(fp, 0, SEEK_END);
  out.resize((size_t)std::ftell(fp));
  std::fseek(fp, 0, SEEK_SET);
  const bool ok = std::fread(out.data(), 1, out.size(), fp) == out.size();
  std::fclose(fp);
  return ok;
}
struct Reader {
  const std::vector<uint8_t>& b;
  size_t pos = 0;
  template <class T>
  T get() {
    if (pos + sizeof(T) > b.size()) throw std::runtime_error("truncated GGUF");
    T v;
    std::memcpy(&v, &b[pos], sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (pos + n > b.size()) throw std::runtime_error("truncated GGUF string");
    std::string s((const char*)&b[pos], n);
    pos += n;
    return s;
  }
  void skip(uint32_t type) {
    static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      str();
    } else if (type == 9) {
      const uint32_t et = get<uint32_t>();
      const uint64_t n = get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) skip(et);
    } else if (type < 13) {
      pos += size[type];
    } else {
      throw std::runtime_error("bad GGUF value type");
    }
  }
};
struct TensorInfo {
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};
// quants.gguf's tensors (name → info) and the data section's start.
bool parse_gguf(const std::vector<uint8_t>& b, std::map<std::string, TensorInfo>& ts, size_t& data, std::string& err) {
  try {
    Reader r{b};
    if (r.get<uint32_t>() != 0x46554747u) throw std::runtime_error("not a GGUF file");
    const uint32_t version = r.get<uint32_t>();
    if (version != 3 && version != 2) throw std::runtime_error("GGUF version");
    const uint64_t nt = r.get<uint64_t>(), nkv = r.get<uint64_t>();
    uint64_t align = 32;
    for (uint64_t i = 0; i < nkv; ++i) {
      const std::string key = r.str();
      const uint32_t type = r.get<uint32_t>();
      if (key == "general.alignment" && type == 4) align = r.get<uint32_t>();
      else r.skip(type);
    }
    for (uint64_t i = 0; i < nt; ++i) {
      TensorInfo t;
      const std::string name = r.str();
      const uint32_t nd = r.get<uint32_t>();
      for (uint32_t d = 0; d < nd; ++d) t.dims.push_back(r.get<uint64_t>());
      t.type = r.get<uint32_t>();
      t.offset = r.get<uint64_t>();
      ts[name] = t;
    }
    data = (r.pos + align - 1) / align * align;
  } catch (const std::exception& e) {
    err = e.what();
    return false;
  }
  return true;
}
// A little-endian float32 C-order .npy: shape and the raw bits.
bool read_npy(const std::string& path, std::vector<size_t>& shape, std::vector<uint32_t>& bits) {
  std::vector<uint8_t> b;
  if (!read_file(path, b) || b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) return false;
  size_t hlen, start;
  if (b[6] == 1) {
    hlen = b[8] | b[9] << 8;
    start = 10;
  } else {
    hlen = b[8] | b[9] << 8 | b[10] << 16 | (size_t)b[11] << 24;
    start = 12;
  }
  const std::string h((const char*)&b[start], hlen);
  if (h.find("'descr': '<f4'") == std::string::npos || h.find("'fortran_order': False") == std::string::npos) return false;
  const size_t s0 = h.find("'shape': ("), s1 = h.find(')', s0);
  std::string dims = h.substr(s0 + 10, s1 - s0 - 10);
  shape.clear();
  for (size_t p = 0; p < dims.size();) {
    while (p < dims.size() && (dims[p] == ' ' || dims[p] == ',')) ++p;
    if (p >= dims.size()) break;
    shape.push_back(std::strtoull(dims.c_str() + p, nullptr, 10));
    while (p < dims.size() && dims[p] != ',') ++p;
  }
  size_t n = 1;
  for (size_t d : shape) n *= d;
  if (b.size() < start + hlen + 4 * n) return false;
  bits.resize(n);
  std::memcpy(bits.data(), &b[start + hlen], 4 * n);
  return true;
}

void known_answers() {
  const char* env = std::getenv("KERN_TEST_DATA");
  const std::string dir = (env ? std::string(env) : repo_root() + "/build/test-data") + "/gguf-quants";
  std::vector<uint8_t> file;
  const bool require = std::getenv("KERN_REQUIRE_TEST_DATA") != nullptr || std::getenv("CI") != nullptr;
  if (!read_file(dir + "/quants.gguf", file)) {
    const std::string msg = dir + "/quants.gguf is missing: run `bash scripts/test.sh` (or `.venv-cuda/bin/python scripts/gen-gguf-quants.py " + dir + "`)";
    if (require) {
      report(false, "known answers: " + msg);
    } else {
      std::printf("SKIPPED known answers: %s\n", msg.c_str());
      ++skips;
    }
    return;
  }
  std::map<std::string, TensorInfo> ts;
  size_t data = 0;
  std::string err;
  if (!parse_gguf(file, ts, data, err)) {
    report(false, "known answers: " + dir + "/quants.gguf: " + err);
    return;
  }
  for (const TypeInfo& ty : TYPES) {
    auto it = ts.find(ty.name);
    std::vector<size_t> shape;
    std::vector<uint32_t> bits;
    if (it == ts.end() || it->second.dims.size() != 2 || !read_npy(dir + "/" + ty.name + ".npy", shape, bits) ||
        shape.size() != 2 || shape[1] != it->second.dims[0] || shape[0] != it->second.dims[1]) {
      report(false, fmt("known answers %s: tensor or .npy missing or of another shape", ty.name));
      continue;
    }
    const int K = (int)shape[1], N = (int)shape[0];
    const size_t bytes = (size_t)N * K / ty.be * ty.bb;
    if (data + it->second.offset + bytes > file.size()) {
      report(false, fmt("known answers %s: tensor data past the end of the file", ty.name));
      continue;
    }
    const uint8_t* W = &file[data + it->second.offset];
    std::vector<float> ref;
    ref_matrix(ty, W, N, K, ref, nullptr);
    size_t bad = 0, first = 0, nan = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      nan += std::isnan(bitsf(bits[i]));
      if (fbits(ref[i]) != bits[i] && bad++ == 0) first = i;
    }
    report(bad == 0, fmt("known answers %s: reference == gguf-py dequantize, f32 bits, %zu blocks (%zu NaN values)%s", ty.name,
                         ref.size() / ty.be, nan,
                         bad ? fmt(" -- %zu differ, first element %zu: %08x vs %08x", bad, first, fbits(ref[first]), bits[first]).c_str() : ""));
    std::vector<float> npy(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) npy[i] = bitsf(bits[i]);
    std::string why;
    const bool ok = run_dequant(ty, W, N, K, npy, 3, why);
    report(ok, fmt("known answers dequant_%s_bf16 == bf16(gguf-py), %d x %d at row 3%s", ty.kern, N, K, why.c_str()));
  }
}

// ------------------------------------------------------------------ GEMV cases
struct Mat {
  const TypeInfo* ty;
  int N, K;
  Buf<uint8_t> W;
  std::vector<float> w, mag;
  Mat(const TypeInfo& t, int n, int k) : ty(&t), N(n), K(k), W((size_t)n * k / t.be * t.bb) {
    const auto v = rand_blocks(t, (size_t)n * k / t.be);
    std::memcpy(W.p, v.data(), v.size());
    ref_matrix(t, W.p, n, k, w, &mag);
  }
};

const uint16_t POISON = 0x7fc1;
const uint32_t POISON32 = 0x7fc00123u;

// y (bf16 and f32 versions, rows of ldy) of one launch; entries run with the given M.
void launch(const Mat& A, const Buf<uint16_t>& x, const Buf<uint16_t>* bias, int M, int ldy, int col0, Buf<uint16_t>* yb,
            Buf<float>* yf) {
  const auto e = ENTRY.at(A.ty->kern);
  const auto* xp = reinterpret_cast<const __nv_bfloat16*>(x.p);
  const auto* bp = bias ? reinterpret_cast<const __nv_bfloat16*>(bias->p) : nullptr;
  const uint3_ grid{(unsigned)((A.N + 15) / 16), 1, 1};
  const GemvBf16 fb = g_warps == 8 ? e.gemv_w8 : e.gemv;
  const GemvF32 ff = g_warps == 8 ? e.gemv_w8_f32 : e.gemv_f32;
  if (yb) emu_launch(grid, 32 * g_warps, [&] { fb(xp, A.W.p, bp, reinterpret_cast<__nv_bfloat16*>(yb->p), M, A.N, A.K, ldy, col0); });
  if (yf) emu_launch(grid, 32 * g_warps, [&] { ff(xp, A.W.p, bp, yf->p, M, A.N, A.K, ldy, col0); });
}

double worst_ratio = 0.0;

// Checks y (M rows of ldy) at columns col0 .. col0+N-1 against the fp64 reference; returns "" or why.
std::string check_gemv(const Mat& A, const Buf<uint16_t>& x, const Buf<uint16_t>* bias, int M, int ldy, int col0,
                       Buf<uint16_t>& yb, Buf<float>& yf) {
  const int N = A.N, K = A.K;
  const double tol_rel = (K / 16.0 + 16.0) * std::ldexp(1.0, -22);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < K; ++k) {
        const double xv = bf16f(x[(size_t)m * K + k]);
        ref += xv * (double)A.w[(size_t)n * K + k];
        mag += std::fabs(xv) * (double)A.mag[(size_t)n * K + k];
      }
      if (bias) ref += bf16f((*bias)[n]), mag += std::fabs(bf16f((*bias)[n]));
      const size_t at = (size_t)m * ldy + col0 + n;
      const double err = std::fabs((double)yf[at] - ref), tol = tol_rel * mag + 1e-30;
      worst_ratio = std::max(worst_ratio, err / tol);
      if (!(err <= tol)) return fmt("row %d col %d: f32 %.9g, fp64 %.9g (err %.3g > tol %.3g)", m, n, yf[at], ref, err, tol);
      if (yb[at] != to_bf16(yf[at])) return fmt("row %d col %d: bf16 %04x != bf16(f32out %.9g) %04x", m, n, yb[at], yf[at], to_bf16(yf[at]));
    }
  return "";
}
bool untouched_outside(const Buf<uint16_t>& yb, const Buf<float>& yf, size_t rows, int ldy, int M, int col0, int N) {
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < ldy; ++c) {
      if ((int)r < M && c >= col0 && c < col0 + N) continue;
      if (yb[r * ldy + c] != POISON || fbits(yf[r * ldy + c]) != POISON32) return false;
    }
  return true;
}

Buf<uint16_t>* rand_x(int M, int K) {
  auto* x = new Buf<uint16_t>((size_t)M * K);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < x->n; ++i) (*x)[i] = to_bf16(nd(rng));
  return x;
}
void poison(Buf<uint16_t>& b, Buf<float>& f) {
  for (size_t i = 0; i < b.n; ++i) b[i] = POISON;
  for (size_t i = 0; i < f.n; ++i) f[i] = bitsf(POISON32);
}

// One matrix: M = 1, 3, 8, 11 (+ guard row), bias on/off, ldy > N with col0; the rows' bits must
// agree across M (batch invariance) and with a launch of M = 1 per row.
void case_gemv(const TypeInfo& ty, int N, int K, bool with_bias) {
  Mat A(ty, N, K);
  std::unique_ptr<Buf<uint16_t>> x(rand_x(11, K));
  Buf<uint16_t> bias(N);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (int n = 0; n < N; ++n) bias[n] = to_bf16(nd(rng));
  const Buf<uint16_t>* bp = with_bias ? &bias : nullptr;
  const int ldy = N + 7, col0 = 3;
  std::map<int, std::vector<uint16_t>> rows_b;  // M → y rows (bf16 bits, N per row)
  std::map<int, std::vector<uint32_t>> rows_f;
  std::string why;
  for (int M : {1, 3, 8, 11}) {
    Buf<uint16_t> yb((size_t)(M + 1) * ldy);
    Buf<float> yf((size_t)(M + 1) * ldy);
    poison(yb, yf);
    launch(A, *x, bp, M, ldy, col0, &yb, &yf);
    std::string w = check_gemv(A, *x, bp, M, ldy, col0, yb, yf);
    if (w.empty() && !untouched_outside(yb, yf, M + 1, ldy, M, col0, N)) w = "wrote outside rows < M / columns col0 .. col0+N-1";
    if (!w.empty() && why.empty()) why = fmt("M=%d: %s", M, w.c_str());
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        rows_b[M].push_back(yb[(size_t)m * ldy + col0 + n]);
        rows_f[M].push_back(fbits(yf[(size_t)m * ldy + col0 + n]));
      }
  }
  report(why.empty(), fmt("gemv_%s%s (+_f32out) N=%d K=%d%s M=1,3,8,11 ldy=%d col0=%d vs fp64%s%s", ty.kern, g_warps == 8 ? "_w8" : "", N, K, with_bias ? " +bias" : "",
                          ldy, col0, why.empty() ? "" : ": ", why.c_str()));
  // Batch invariance: the first rows of every M agree; rows 8..10 of M = 11 (second pass) equal
  // an M = 3 launch on those x rows; a row alone (M = 1) equals its place in M = 8.
  bool same = true;
  for (int M : {3, 8, 11})
    for (int i = 0; i < std::min(M, 3) * N; ++i)
      same &= rows_b[M][i] == rows_b[3][i] && rows_f[M][i] == rows_f[3][i];
  for (int i = 0; i < N; ++i) same &= rows_f[1][i] == rows_f[8][i] && rows_b[1][i] == rows_b[8][i];
  {
    Buf<uint16_t> x3((size_t)3 * K);
    std::memcpy(x3.p, x->p + (size_t)8 * K, (size_t)3 * K * 2);
    Buf<uint16_t> yb((size_t)3 * N);
    Buf<float> yf((size_t)3 * N);
    launch(A, x3, bp, 3, N, 0, &yb, &yf);
    for (int m = 0; m < 3; ++m)
      for (int n = 0; n < N; ++n)
        same &= yb[(size_t)m * N + n] == rows_b[11][(size_t)(8 + m) * N + n] && fbits(yf[(size_t)m * N + n]) == rows_f[11][(size_t)(8 + m) * N + n];
    Buf<uint16_t> x1(K);
    std::memcpy(x1.p, x->p + (size_t)5 * K, (size_t)K * 2);
    Buf<uint16_t> yb1(N);
    Buf<float> yf1(N);
    launch(A, x1, bp, 1, N, 0, &yb1, &yf1);
    for (int n = 0; n < N; ++n) same &= yb1[n] == rows_b[8][(size_t)5 * N + n] && fbits(yf1[n]) == rows_f[8][(size_t)5 * N + n];
  }
  report(same, fmt("gemv_%s%s N=%d K=%d batch invariance: row bits equal for M = 1, 3, 8, 11 (second pass) and alone", ty.kern,
                   g_warps == 8 ? "_w8" : "", N, K));
}

// A Q4_K_M-style fused qkv row buffer: q (Q4_K), k (Q4_K), v (Q6_K) into one [M, Nq + Nk + Nv]
// buffer through ldy / col0, with another type for good measure (Q8_0 for v at a second K).
void case_fused(const char* tq, const char* tv, int Nq, int Nkv, int K) {
  const TypeInfo *TQ = nullptr, *TV = nullptr;
  for (const auto& t : TYPES) {
    if (std::string(t.name) == tq) TQ = &t;
    if (std::string(t.name) == tv) TV = &t;
  }
  Mat q(*TQ, Nq, K), k(*TQ, Nkv, K), v(*TV, Nkv, K);
  const int M = 5, ldy = Nq + 2 * Nkv;
  std::unique_ptr<Buf<uint16_t>> x(rand_x(M, K));
  Buf<uint16_t> yb((size_t)(M + 1) * ldy);
  Buf<float> yf((size_t)(M + 1) * ldy);
  poison(yb, yf);
  launch(q, *x, nullptr, M, ldy, 0, &yb, &yf);
  launch(k, *x, nullptr, M, ldy, Nq, &yb, &yf);
  launch(v, *x, nullptr, M, ldy, Nq + Nkv, &yb, &yf);
  std::string why = check_gemv(q, *x, nullptr, M, ldy, 0, yb, yf);
  if (why.empty()) why = check_gemv(k, *x, nullptr, M, ldy, Nq, yb, yf);
  if (why.empty()) why = check_gemv(v, *x, nullptr, M, ldy, Nq + Nkv, yb, yf);
  if (why.empty() && !untouched_outside(yb, yf, M + 1, ldy, M, 0, ldy)) why = "the guard row was written";
  report(why.empty(), fmt("fused qkv row buffer (%d warps): q %s [%d], k %s [%d], v %s [%d], K=%d, M=%d (ldy %d, col0 0/%d/%d)%s%s", g_warps, tq, Nq, tq, Nkv, tv,
                          Nkv, K, M, ldy, Nq, Nq + Nkv, why.empty() ? "" : ": ", why.c_str()));
}

}  // namespace

int main() {
  const auto t0 = std::chrono::steady_clock::now();
  known_answers();
  // Random blocks, finite scales: the dequant kernels, including a row offset and odd shapes.
  for (const TypeInfo& ty : TYPES) {
    const int K = ty.be == 32 ? 32 * 23 : 256 * 3, N = 5;
    Mat A(ty, N, K);
    std::string why;
    const bool ok = run_dequant(ty, A.W.p, N, K, A.w, 2, why);
    report(ok, fmt("dequant_%s_bf16 %d x %d at row 2 == bf16(reference)%s", ty.kern, N, K, why.c_str()));
  }
  // GEMVs. K: 5 units (warp 0 takes two: the ring), 13+ units (every stage of the ring reused),
  // a partial last unit for the 32-element types (K % 128 != 0; 23 blocks = rows 2 mod 4 apart
  // for the 2-byte-aligned types); Q6_K with an odd number of super-blocks (rows 2 mod 4 apart).
  // The 8-warp family: K of 9 and 25+ units (warps 0 .. 7 each with two or more).
  for (int warps : {4, 8}) {
    g_warps = warps;
    for (const TypeInfo& ty : TYPES) {
      if (ty.be == 32) {
        case_gemv(ty, 40, 32 * 23 + (warps == 8 ? 128 * 4 : 0), true);
        case_gemv(ty, 16, 128 * (warps == 8 ? 25 : 13) + 64, false);
      } else {
        case_gemv(ty, 40, 256 * (warps == 8 ? 9 : 5), true);
        case_gemv(ty, 9, 256 * (warps == 8 ? 25 : 13), false);
      }
    }
    case_fused("Q4_K", "Q6_K", 64, 24, 512);
    case_fused("Q5_0", "Q8_0", 32, 16, 896);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("gemv-gguf: %d passed, %d failed, %d skipped (worst GEMV error / tolerance %.3g) in %.1f s\n", passes, fails, skips,
              worst_ratio, secs);
  return fails ? 1 : 0;
}
