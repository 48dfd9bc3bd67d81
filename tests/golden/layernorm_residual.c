/* k0_add_layernormalization: Add -> LayerNormalization */
/* template reduction, kind linear, 2 node(s) */
/* rules: fuse_reduction (rules/example.fuse:7) */
AF_INTERNAL AF_WIDE_VECTORS void k0_add_layernormalization(const float* restrict t_x, const float* restrict t_residual, const float* restrict t_const_2, const float* restrict t_const_3, float* restrict t_add_1_out, float* restrict t_layernormalization_4_out, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* stage 0: LayerNormalization layernormalization_4 over axes [2] of add_1_out [1, 128, 768]: 128 rows x 768 */
    #pragma omp parallel num_threads(nt)
    {
        float* restrict s0_xrow = (float*)af_thread_block(768 * sizeof(float)); /* this thread's */
        #pragma omp for schedule(dynamic, 4)
        for (int64_t row = 0; row < 128; ++row) {
            const int64_t i1 = row;
            double s0_s1 = 0.0;
            #pragma omp simd reduction(+:s0_s1)
            for (int64_t j = 0; j < 768; ++j) {
                const int64_t i2 = j;
                const float v6 = t_x[i1 * 768 + i2];
                const float v7 = t_residual[i1 * 768 + i2];
                const float v8 = v6 + v7;
                s0_xrow[j] = v8;
                t_add_1_out[i1 * 768 + i2] = v8;
                s0_s1 += (double)v8;
            }
            const float s0_mean = (float)(s0_s1 / 768);
            double s0_s2 = 0.0;
            #pragma omp simd reduction(+:s0_s2)
            for (int64_t j = 0; j < 768; ++j) {
                const int64_t i2 = j;
                s0_s2 += (double)(((float)s0_xrow[j] - s0_mean) * ((float)s0_xrow[j] - s0_mean));
            }
            const float s0_var = (float)(s0_s2 / 768);
            const float s0_inv = 1.0f / sqrtf(s0_var + 1.0e-12f);
            const float s0_den = sqrtf(s0_var + 1.0e-12f);
            #pragma omp simd
            for (int64_t j = 0; j < 768; ++j) {
                const int64_t i2 = j;
                const float v9 = s0_xrow[i2];
                const float v10 = t_const_2[i2];
                const float v11 = t_const_3[i2];
                const float v12 = ((float)v9 - s0_mean) * s0_inv * v10 + v11;
                t_layernormalization_4_out[i1 * 768 + i2] = v12;
            }
        }
    }
}
