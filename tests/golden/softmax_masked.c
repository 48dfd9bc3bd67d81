/* k0_div_add_softmax: Div -> Add -> Softmax */
/* template reduction, kind linear, 3 node(s) */
/* rules: fuse_reduction (rules/example.fuse:7) */
AF_INTERNAL AF_WIDE_VECTORS void k0_div_add_softmax(const float* restrict t_scores, const float* restrict t_mask, float* restrict t_softmax_4_out, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* stage 0: Softmax softmax_4 over axes [3] of add_3_out [1, 12, 128, 128]: 1536 rows x 128 */
    #pragma omp parallel num_threads(nt)
    {
        /* this thread's copy of X's row and row the passes fill (s0_erow) */
        float* restrict s0_rows = (float*)af_thread_block(2 * 128 * sizeof(float));
        float* restrict s0_xrow = s0_rows;
        float* restrict s0_erow = s0_rows + 128;
        #pragma omp for schedule(dynamic, 48)
        for (int64_t row = 0; row < 1536; ++row) {
            const int64_t i1 = row / 128;
            const int64_t i2 = row % 128;
            float s0_max = (-INFINITY);
            #pragma omp simd reduction(max:s0_max)
            for (int64_t j = 0; j < 128; ++j) {
                const int64_t i3 = j;
                const float v2 = t_scores[i1 * 16384 + i2 * 128 + i3];
                const float v3 = v2 / 8.0f;
                const float v4 = t_mask[i3];
                const float v5 = v3 + v4;
                s0_xrow[j] = v5;
                s0_max = s0_max > v5 ? s0_max : v5;
            }
            double s0_sum = 0.0;
            #pragma omp simd reduction(+:s0_sum)
            for (int64_t j = 0; j < 128; ++j) {
                const int64_t i3 = j;
                { const float s0_e = af_expf(s0_xrow[j] - s0_max); s0_erow[j] = s0_e; s0_sum += s0_e; }
            }
            const float s0_inv = (float)(1.0 / s0_sum);
            #pragma omp simd
            for (int64_t j = 0; j < 128; ++j) {
                const int64_t i3 = j;
                const float v6 = s0_erow[i3] * s0_inv;
                t_softmax_4_out[i1 * 16384 + i2 * 128 + i3] = v6;
            }
        }
    }
}
