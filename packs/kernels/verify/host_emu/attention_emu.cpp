// attention.cu (attention_d64 / attention_d128 / attention_d256) on the CPU, beside
// attention_decode.cu and attention_prefill.cu in their emulations: its own translation unit (the
// sources define the same static helpers). attention_entries.h is included after the source so
// that its declarations are checked against the definitions here.
#include "../../attention.cu"
#include "attention_entries.h"
