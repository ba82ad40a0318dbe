// attention.cu (attention_d64 / attention_d128 / attention_d256) on the CPU, beside
// attention_decode.cu and attention_prefill.cu in their emulations: its own translation unit (the
// sources define the same static helpers). attention_entries.h is included after the source so
// that its declarations are checked against the definitions here.
#include "../../attention.cu"
#include "attention_entries.h"

// The shared memory of attention_dD (sizeof(AttSmem<D>): the host's layout is the device's; ptxas
// reports the same static sizes for D = 64 and 128). D = 256 is above the 48 KiB a kernel may declare
// statically, so it is the launch's dynamic shared memory: the manifest's `shared` for
// attention_d256 must be at least 86032 bytes (KERNELS.md, verify_with_kern.py, verify_kernels.py).
static_assert(sizeof(AttSmem<64>) == 24592 && sizeof(AttSmem<128>) == 45072,
              "attention_dD's static shared memory changed: update KERNELS.md");
static_assert(sizeof(AttSmem<256>) == 86032,
              "attention_d256's dynamic shared memory changed: update KERNELS.md and the GPU harnesses' `shared`");
