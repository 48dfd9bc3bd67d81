/* k0_matmul_add_div_erf_mul: MatMul -> Add -> Div -> Erf -> Mul -> Add -> Mul */
/* template gemm_epilogue, kind linear, 7 node(s) */
/* rules: fuse_gemm_epilogue (rules/example.fuse:7) */
AF_INTERNAL void k0_matmul_add_div_erf_mul(const float* restrict t_hidden, const float* restrict t_const_1, const float* restrict t_const_3, float* restrict t_mul_12_out, const float* restrict t_d_matmul_2_packed, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* sgemm tiles of 128x512 with the epilogue per tile: MatMul -> Add -> Div -> Erf -> Mul -> Add -> Mul */
    {
        scipy_openblas_set_num_threads(1); /* tiles run in parallel, one sgemm per thread at a time */
        #pragma omp parallel num_threads(nt)
        {
            float* restrict tile = (float*)af_thread_block(49152 * sizeof(float)); /* this thread's */
            /* MatMul matmul_2: 1 x [128 x 768] @ [768 x 3072] -> matmul_2_out */
            #pragma omp for schedule(dynamic, 1) nowait
            for (int64_t t = 0; t < 8; ++t) {
                const int64_t b = t / 8;
                const int64_t m0 = (t / 8) % 1 * 128;
                const int64_t n0 = t % 8 * 384;
                const int mlen = (int)(128 - m0 < 128 ? 128 - m0 : 128);
                const int nlen = (int)(3072 - n0 < 384 ? 3072 - n0 : 384);
                (void)b;
                float* restrict c = tile;
                AF_WIDE_PACKED_FOR(48);
                af_sgemm_packed_wide(mlen, nlen, 768, 1024, 1.0f, t_hidden + (m0 * 768), 768, 1,
                                t_d_matmul_2_packed + n0 * 768, c, 384);
                {
                    const int64_t lo = 0, hi = nlen;
                    for (int64_t mi = 0; mi < mlen; ++mi) {
                        const int64_t r = m0 + mi;
                        const int64_t i1 = r;
                        for (int64_t ni = lo; ni < hi; ++ni) {
                            const int64_t i2 = n0 + ni;
                            const float v9 = c[mi * 384 + ni];
                            const float v10 = t_const_3[i2];
                            const float v11 = v9 + v10;
                            const float v12 = v11 * 0.5f;
                            const float v13 = v11 / 1.4142135f;
                            const float v14 = af_erff(v13);
                            const float v15 = v14 + 1.0f;
                            const float v16 = v12 * v15;
                            t_mul_12_out[i1 * 3072 + i2] = v16;
                        }
                    }
                }
            }
        }
    }
}
