// attention.cu (attention_d128 / attention_d64) on the CPU, beside attention_decode.cu in
// attention_decode_emu.cpp: its own translation unit (both sources define the same static helpers).
#include "../../attention.cu"
