/* k0_conv_add_relu: Conv -> Add -> Relu */
/* template conv_epilogue, kind linear, 3 node(s) */
/* rules: fuse_conv_epilogue (rules/example.fuse:7) */
AF_INTERNAL void k0_conv_add_relu(const float* restrict t_x, const float* restrict t_const_2, const float* restrict t_skip, float* restrict t_relu_5_out, const float* restrict t_d_conv_3_packed, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* Conv conv_3: [1, 64, 56, 56] * [64, 64, 3, 3] -> [1, 64, 56, 56], group 1, taps read in place; epilogue per tile: Conv -> Add -> Relu */
    {
        scipy_openblas_set_num_threads(1); /* tiles run in parallel, one sgemm per thread at a time */
        #pragma omp parallel num_threads(nt)
        {
            char* restrict block = (char*)af_thread_block(641280); /* this thread's */
            /* this thread's slab: a block's input rows zero-padded and split by stride phase,
               [channel][row phase][column phase][row][column]; offs: where each (channel, tap) starts in
               it, so that the taps are read in place (af_sgemm_packed_taps) */
            float* restrict slab = (float*)block;
            int32_t* restrict offs = (int32_t*)(block + 237568);
            {
                static const int32_t tap_start[9] = { 0, 1, 2, 58, 59, 60, 116, 117, 118 };
                for (int64_t row = 0; row < 576; ++row)
                    offs[row] = (int32_t)(row / 9 * 928 + tap_start[row % 9]);
            }
            float* restrict tile = (float*)(block + 239872);
            float* restrict tile_t = (float*)(block + 440576); /* the tile channel-major */
            /* one task per (image, group, channel block, block of whole output rows): no barrier between them */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < 4; ++t) {
                const int64_t n = t / 4;
                const int64_t gi = t / 4 % 1;
                const int64_t m0 = t / 4 % 1 * 64;
                const int64_t p0 = t % 4 * 784;
                const int mlen = (int)(64 - m0 < 64 ? 64 - m0 : 64);
                const int plen = (int)(3136 - p0 < 784 ? 3136 - p0 : 784);
                const float* restrict xg = t_x + (n * 64 + gi * 64) * 3136;
                /* the block's input rows, each copied once (im2col copies it once per tap) */
                static const int64_t row_phase[1] = { 0 };
                static const int64_t col_phase[1] = { 0 };
                const int64_t q0 = p0 / 56, srows = plen / 56 + 2;
                for (int64_t ch = 0; ch < 64; ++ch)
                    for (int64_t a = 0; a < 1; ++a)
                        for (int64_t r = 0; r < srows; ++r) {
                            float* restrict dst = slab + ch * 928 + a * 928 + r * 58;
                            const int64_t y = (q0 + r) * 1 + row_phase[a] - 1;
                            /* a row outside the image is all padding: an empty range, not a branch (as in im2col) */
                            const int64_t inside = (y >= 0) & (y < 56);
                            const float* restrict src = xg + ch * 3136 + inside * y * 56;
                            for (int64_t b = 0; b < 1; ++b) {
                                /* the plane's columns whose input column j * sw + phase - pw is inside the image: [lo, hi) */
                                const int64_t first = 1 - col_phase[b], last = 56 - col_phase[b];
                                int64_t lo = first > 0 ? (first + 0) / 1 : 0;
                                int64_t hi = last >= 0 ? last / 1 + 1 : 0;
                                if (hi > 58) hi = 58;
                                if (lo > hi || !inside) lo = hi;
                                float* restrict out = dst + b * 928;
                                for (int64_t j = 0; j < lo; ++j) out[j] = 0.0f;
                                for (int64_t j = lo; j < hi; ++j) out[j] = src[j * 1 - first];
                                for (int64_t j = hi; j < 58; ++j) out[j] = 0.0f;
                            }
                        }
                const float* restrict cols = slab;
                float* restrict c = tile_t;
                /* the tile transposed, [positions x channels]: the taps (read in place) @ the packed W^T */
                AF_PACKED_FOR(32);
                af_sgemm_packed_taps((int)(plen / 56), 56, 58, 1, mlen, 576, 1024, 1.0f, cols, offs,
                                     t_d_conv_3_packed + gi * 36864 + m0 * 576, tile, 64);
                /* the tile is [positions x channels]: turned channel-major, so that the epilogue reads and
                   writes rows of positions in order */
                af_transpose(plen, mlen, tile, 64, c, 784);
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
                            const float v6 = c[mi * 784 + q * 56 + ow] + v5;
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
