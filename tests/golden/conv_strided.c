/* k0_conv_relu: Conv -> Relu */
/* template conv_epilogue, kind linear, 2 node(s) */
/* rules: fuse_conv_epilogue (rules/example.fuse:7) */
AF_INTERNAL void k0_conv_relu(const float* restrict t_x, const float* restrict t_const_2, float* restrict t_relu_4_out, const float* restrict t_d_conv_3_packed, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* Conv conv_3: [1, 64, 56, 56] * [128, 64, 3, 3] -> [1, 128, 28, 28], group 1, taps read in place; epilogue per tile: Conv -> Relu */
    {
        scipy_openblas_set_num_threads(1); /* tiles run in parallel, one sgemm per thread at a time */
        #pragma omp parallel num_threads(nt)
        {
            char* restrict block = (char*)af_thread_block(440576); /* this thread's */
            /* this thread's slab: a block's input rows zero-padded and split by stride phase,
               [channel][row phase][column phase][row][column]; offs: where each (channel, tap) starts in
               it, so that the taps are read in place (af_sgemm_packed_taps) */
            float* restrict slab = (float*)block;
            int32_t* restrict offs = (int32_t*)(block + 237568);
            {
                static const int32_t tap_start[9] = { 0, 232, 1, 464, 696, 465, 29, 261, 30 };
                for (int64_t row = 0; row < 576; ++row)
                    offs[row] = (int32_t)(row / 9 * 928 + tap_start[row % 9]);
            }
            float* restrict tile = (float*)(block + 239872);
            float* restrict tile_t = (float*)(block + 340224); /* the tile channel-major */
            /* one task per (image, group, channel block, block of whole output rows): no barrier between them */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < 4; ++t) {
                const int64_t n = t / 4;
                const int64_t gi = t / 4 % 1;
                const int64_t m0 = t / 4 % 1 * 128;
                const int64_t p0 = t % 4 * 196;
                const int mlen = (int)(128 - m0 < 128 ? 128 - m0 : 128);
                const int plen = (int)(784 - p0 < 196 ? 784 - p0 : 196);
                const float* restrict xg = t_x + (n * 64 + gi * 64) * 3136;
                /* the block's input rows, each copied once (im2col copies it once per tap) */
                static const int64_t row_phase[2] = { 0, 1 };
                static const int64_t col_phase[2] = { 0, 1 };
                const int64_t q0 = p0 / 28, srows = plen / 28 + 1;
                for (int64_t ch = 0; ch < 64; ++ch)
                    for (int64_t a = 0; a < 2; ++a)
                        for (int64_t r = 0; r < srows; ++r) {
                            float* restrict dst = slab + ch * 928 + a * 464 + r * 29;
                            const int64_t y = (q0 + r) * 2 + row_phase[a] - 1;
                            /* a row outside the image is all padding: an empty range, not a branch (as in im2col) */
                            const int64_t inside = (y >= 0) & (y < 56);
                            const float* restrict src = xg + ch * 3136 + inside * y * 56;
                            for (int64_t b = 0; b < 2; ++b) {
                                /* the plane's columns whose input column j * sw + phase - pw is inside the image: [lo, hi) */
                                const int64_t first = 1 - col_phase[b], last = 56 - col_phase[b];
                                int64_t lo = first > 0 ? (first + 1) / 2 : 0;
                                int64_t hi = last >= 0 ? last / 2 + 1 : 0;
                                if (hi > 29) hi = 29;
                                if (lo > hi || !inside) lo = hi;
                                float* restrict out = dst + b * 232;
                                for (int64_t j = 0; j < lo; ++j) out[j] = 0.0f;
                                for (int64_t j = lo; j < hi; ++j) out[j] = src[j * 2 - first];
                                for (int64_t j = hi; j < 29; ++j) out[j] = 0.0f;
                            }
                        }
                const float* restrict cols = slab;
                float* restrict c = tile_t;
                /* the tile transposed, [positions x channels]: the taps (read in place) @ the packed W^T */
                AF_PACKED_FOR(32);
                af_sgemm_packed_taps((int)(plen / 28), 28, 29, 1, mlen, 576, 1024, 1.0f, cols, offs,
                                     t_d_conv_3_packed + gi * 73728 + m0 * 576, tile, 128);
                /* the tile is [positions x channels]: turned channel-major, so that the epilogue reads and
                   writes rows of positions in order */
                af_transpose(plen, mlen, tile, 128, c, 196);
                for (int64_t mi = 0; mi < mlen; ++mi) {
                    const int64_t i0 = n;
                    const int64_t i1 = gi * 128 + m0 + mi;
                    (void)i0;
                    for (int64_t q = 0; q < plen / 28; ++q) {
                        const int64_t srow = p0 / 28 + q;
                        (void)srow;
                        const int64_t i2 = srow;
                        for (int64_t ow = 0; ow < 28; ++ow) {
                            const int64_t i3 = ow;
                            const float v3 = t_const_2[i1];
                            const float v4 = c[mi * 196 + q * 28 + ow] + v3;
                            const float v5 = (v4 < 0.0f ? 0.0f : v4);
                            t_relu_4_out[i1 * 784 + i2 * 28 + i3] = v5;
                        }
                    }
                }
            }
        }
    }
}
