/* A stand-in libnccl.so.2 for crates/kern-cuda/tests/fake_nccl.rs: the entry points kern
 * resolves, with NCCL's C prototypes, answering without a GPU. VERSION, NO_ALLGATHER and FAIL_ID are
 * set by the test's compiler flags. */
#include <string.h>
#ifndef VERSION
#define VERSION 22703
#endif
typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
static int group_depth = 0;
ncclResult_t ncclGetVersion(int *v) { *v = VERSION; return 0; }
const char *ncclGetErrorString(ncclResult_t r) { return r == 3 ? "fake: internal error" : "fake error"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
#ifdef FAIL_ID
  (void)id; return 3; /* ncclInternalError */
#else
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 3); return 0;
#endif
}
ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int r) { (void)n; (void)id; (void)r; *c = 0; return 2; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { (void)c; return 0; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) { (void)c; *e = 0; return 0; }
ncclResult_t ncclAllReduce(const void *s, void *r, unsigned long n, int t, int op, ncclComm_t c, void *st) { (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; return 2; }
#ifndef NO_ALLGATHER
ncclResult_t ncclAllGather(const void *s, void *r, unsigned long n, int t, ncclComm_t c, void *st) { (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; return 2; }
#endif
ncclResult_t ncclGroupStart(void) { group_depth++; return 0; }
/* NCCL's ncclInvalidUsage (5) when no group is open. */
ncclResult_t ncclGroupEnd(void) { if (group_depth == 0) return 5; group_depth--; return 0; }
