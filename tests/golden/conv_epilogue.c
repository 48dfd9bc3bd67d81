/* k0_conv_add_relu: Conv -> Add -> Relu */
/* template conv_epilogue, kind linear, 3 node(s) */
/* rules: fuse_conv_epilogue (rules/example.fuse:7) */
AF_INTERNAL void k0_conv_add_relu(const float* restrict t_x, const float* restrict t_const_2, const float* restrict t_skip, float* restrict t_relu_5_out, const float* restrict t_d_conv_3_packed, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* Conv conv_3: [1, 64, 56, 56] * [64, 64, 3, 3] -> [1, 64, 56, 56], group 1, im2col yes; epilogue per tile: Conv -> Add -> Relu */
    {
        scipy_openblas_set_num_threads(1); /* tiles run in parallel, one sgemm per thread at a time */
        #pragma omp parallel num_threads(nt)
        {
            char* restrict block = (char*)af_thread_block(573440); /* this thread's */
            float* restrict col = (float*)block; /* im2col block */
            float* restrict tile = (float*)(block + 516096);
            /* one task per (image, group, channel block, block of whole output rows): no barrier between them */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < 14; ++t) {
                const int64_t n = t / 14;
                const int64_t gi = t / 14 % 1;
                const int64_t m0 = t / 14 % 1 * 64;
                const int64_t p0 = t % 14 * 224;
                const int mlen = (int)(64 - m0 < 64 ? 64 - m0 : 64);
                const int plen = (int)(3136 - p0 < 224 ? 3136 - p0 : 224);
                const float* restrict xg = t_x + (n * 64 + gi * 64) * 3136;
                /* im2col of the block: row (c, kd, kh, kw) holds the input under that tap at each output position */
                for (int64_t row = 0; row < 576; ++row) {
                    const int64_t c = row / 9;
                    const int64_t kd = row / 9 % 1;
                    const int64_t kh = row / 3 % 3;
                    const int64_t kw = row % 3;
                    const float* restrict xc = xg + c * 3136;
                    float* restrict dst = col + row * 224 - p0;
                    /* output columns whose input column is inside the image */
                    int64_t ow_lo = (1 - kw * 1 + 0) / 1;
                    int64_t ow_hi = (56 - kw * 1) / 1 + 1;
                    if (1 - kw * 1 < 0) ow_lo = 0;
                    if (56 - kw * 1 < 0) ow_hi = 0;
                    if (ow_hi > 56) ow_hi = 56;
                    if (ow_lo > ow_hi) ow_lo = ow_hi;
                    const int64_t shift = kw * 1 - 1;
                    for (int64_t sp = p0 / 56; sp < (p0 + plen) / 56; ++sp) {
                        const int64_t od = sp / 56, oh = sp % 56;
                        const int64_t id = od * 1 - 0 + kd * 1;
                        const int64_t ih = oh * 1 - 1 + kh * 1;
                        float* restrict out = dst + sp * 56;
                        if (id < 0 || id >= 1 || ih < 0 || ih >= 56) {
                            for (int64_t wo = 0; wo < 56; ++wo) out[wo] = 0.0f;
                            continue;
                        }
                        const float* restrict src = xc + (id * 56 + ih) * 56;
                        for (int64_t wo = 0; wo < ow_lo; ++wo) out[wo] = 0.0f;
                        for (int64_t wo = ow_lo; wo < ow_hi; ++wo) out[wo] = src[wo * 1 + shift];
                        for (int64_t wo = ow_hi; wo < 56; ++wo) out[wo] = 0.0f;
                    }
                }
                const float* restrict cols = col;
                const int ldcol = 224;
                float* restrict c = tile;
                /* the tile transposed, [positions x channels]: cols^T @ the group's packed W^T */
                af_sgemm_packed(plen, mlen, 576, 1024, 1.0f, cols, 1, ldcol,
                                t_d_conv_3_packed + gi * 36864 + m0 * 576, c, 64);
                for (int64_t mi = 0; mi < mlen; ++mi) {
                    const int64_t i0 = n;
                    const int64_t i1 = gi * 64 + m0 + mi;
                    (void)i0;
                    for (int64_t q = 0; q < plen / 56; ++q) {
                        const int64_t srow = p0 / 56 + q;
                        (void)srow;
                        const int64_t i2 = srow;
                        for (int64_t ow = 0; ow < 56; ++ow) {
                            const int64_t i3 = ow;
                            const float v5 = t_const_2[i1];
                            const float v6 = c[(q * 56 + ow) * 64 + mi] + v5;
                            const float v7 = t_skip[i1 * 3136 + i2 * 56 + i3];
                            const float v8 = v6 + v7;
                            const float v9 = (v8 < 0.0f ? 0.0f : v8);
                            t_relu_5_out[i1 * 3136 + i2 * 56 + i3] = v9;
                        }
                    }
                }
            }
        }
    }
}
