// gdn_emu.cpp's checks with gdn.cu built for the tensor-core chunk products (GDN_TC 1: 3xTF32
// mma.sync m16n8k8, emulated from its fragments through emu.h's per-warp slots; not the default build).
//   bash packs/kernels/verify/host_emu/run.sh
#define GDN_TC 1
#include "gdn_emu.cpp"
