// Programming Guide VecAdd kernel, with a small host so the default
// nvcc path produces a host binary.
#include <stdio.h>

__global__ void VecAdd(float *A, float *B, float *C) {
    int i = threadIdx.x;
    C[i] = A[i] + B[i];
}

int main() {
    const int N = 4;
    float h_A[4] = {1.f, 2.f, 3.f, 4.f};
    float h_B[4] = {10.f, 20.f, 30.f, 40.f};
    float h_C[4];

    float *A, *B, *C;
    cudaMalloc(&A, N * sizeof(float));
    cudaMalloc(&B, N * sizeof(float));
    cudaMalloc(&C, N * sizeof(float));
    cudaMemcpy(A, h_A, N * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(B, h_B, N * sizeof(float), cudaMemcpyHostToDevice);

    VecAdd<<<1, N>>>(A, B, C);
    cudaDeviceSynchronize();
    cudaMemcpy(h_C, C, N * sizeof(float), cudaMemcpyDeviceToHost);

    int ok = 1;
    for (int i = 0; i < N; i++) {
        if (h_C[i] != h_A[i] + h_B[i]) {
            ok = 0;
        }
    }
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    return ok ? 0 : 1;
}
