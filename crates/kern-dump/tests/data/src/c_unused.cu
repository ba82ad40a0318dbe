__global__ void Unused(float *A) { A[threadIdx.x] = 0.0f; }
