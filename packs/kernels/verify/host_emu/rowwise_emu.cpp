// rowwise.cu on the CPU (emu.h), its own translation unit: the unfused kernels that
// gemv_fused_emu.cpp compares the fused GEMVs with.
#include "emu_math.h"
#include "../../rowwise.cu"
