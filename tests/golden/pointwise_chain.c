/* k0_add_mul_transpose_sigmoid_relu: Add -> Mul -> Transpose -> Sigmoid -> Relu */
/* template pointwise, kind linear, 5 node(s) */
/* rules: fuse_pointwise (rules/example.fuse:7) */
AF_INTERNAL AF_WIDE_VECTORS void k0_add_mul_transpose_sigmoid_relu(const float* restrict t_x, const float* restrict t_bias, float* restrict t_sigmoid_5_out, float* restrict t_relu_6_out, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* sigmoid_5_out, relu_6_out: [16, 8, 32] */
    for (int64_t o = 0; o < 128; ++o) {
        const int64_t i0 = o / 8;
        const int64_t i1 = o % 8;
        #pragma omp simd
        for (int64_t i2 = 0; i2 < 32; ++i2) {
            const float v1 = t_x[i1 * 512 + i0 * 32 + i2];
            const float v2 = t_bias[i2];
            const float v3 = v1 + v2;
            const float v4 = v3 * 0.5f;
            const float v5 = af_sigmoidf(v4);
            t_sigmoid_5_out[i0 * 256 + i1 * 32 + i2] = v5;
            const float v6 = (v4 < 0.0f ? 0.0f : v4);
            t_relu_6_out[i0 * 256 + i1 * 32 + i2] = v6;
        }
    }
}
