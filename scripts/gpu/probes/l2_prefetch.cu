// Probe kernels for scripts/gpu/probes/l2_prefetch.py (issue 15): does an L2 bulk prefetch of the
// next projection's weights, issued while a latency-bound kernel runs, make that projection run
// from L2? Build: nvcc -gencode arch=compute_90a,code=sm_90a -O3 -cubin
//   -o .carry/probes/l2_prefetch.cubin scripts/gpu/probes/l2_prefetch.cu
#include <stdint.h>

// Spin for `ns` nanoseconds (one CTA): stands for rope + attention, which leave DRAM idle.
// When `bytes` > 0 it first issues cp.async.bulk.prefetch.L2 of [p, p + bytes) in 64 KB pieces.
extern "C" __global__ void busy_prefetch(const char* p, long long bytes, long long ns) {
  if (bytes > 0) {
    const long long piece = 65536;
    for (long long off = (long long)threadIdx.x * piece; off < bytes; off += (long long)blockDim.x * piece) {
      const long long n = bytes - off < piece ? bytes - off : piece;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"((unsigned)n) : "memory");
    }
  }
  if (threadIdx.x == 0) {
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long t = t0;
    while (t - t0 < ns) {
      __nanosleep(200);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }
  }
}
