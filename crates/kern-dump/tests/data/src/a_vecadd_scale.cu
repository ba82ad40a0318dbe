__global__ void VecAdd(float *A, float *B, float *C) {
    int i = threadIdx.x;
    C[i] = A[i] + B[i];
}
__global__ void Scale(float *A, float s, int n) {
    int i = threadIdx.x;
    if (i < n) A[i] *= s;
}
