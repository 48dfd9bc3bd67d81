/* k0_conv_add_relu: Conv -> Add -> Relu */
/* template conv_epilogue, kind linear, 3 node(s) */
/* rules: fuse_conv_epilogue (rules/example.fuse:7) */
AF_INTERNAL void k0_conv_add_relu(const float* restrict t_x, const float* restrict t_const_2, const float* restrict t_skip, float* restrict t_relu_5_out, const float* restrict t_d_conv_3_winograd, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* Conv conv_3: [1, 64, 56, 56] * [64, 64, 3, 3] -> [1, 64, 56, 56], group 1, Winograd F(2x2, 3x3); epilogue per tile: Conv -> Add -> Relu */
    {
        scipy_openblas_set_num_threads(1); /* tiles run in parallel, one sgemm per thread at a time */
        #pragma omp parallel num_threads(nt)
        {
            char* restrict block = (char*)af_thread_block(573440); /* this thread's */
            float* restrict tile = (float*)(block + 458752);
            float* restrict tile_t = (float*)(block + 516096); /* the tile channel-major */
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
                /* Winograd: the input is read through its transform, below */
                float* restrict c = tile_t;
                /* Winograd F(2x2, 3x3) (codegen/winograd.py): each 2x2 block of output positions from the 4x4
                   input patch under it. V = B^T d B of every tile and channel, [16][channel][tile]; the 16
                   products [tiles x C] @ U[e] (U = G g G^T, packed at build time) into M, [16][tile][channel];
                   the tile is A^T M A of each, [positions x channels] as the packed product leaves it */
                {
                    const int64_t row0 = p0 / 56;
                    const int trows = (plen / 56 + 1) / 2, tiles = trows * 28;
                    float* restrict wv = (float*)block;
                    float* restrict wm = wv + (int64_t)1024 * tiles;
                    static const float zero_row[56]; /* (zeros) the rows above and below the image */
                    for (int64_t ch = 0; ch < 64; ++ch) {
                        const float* restrict xc = xg + ch * 3136;
                        for (int tr = 0; tr < trows; ++tr) {
                            /* B^T over the tile row's 4 input rows, straight from the input (copied into a
                               padded row first, its misaligned stores stalled the loads that followed: 12 % of
                               ResNet's layer 1 under perf), then over the columns of each tile; column j is the
                               image's j - 1, zero outside it */
                            const float* rows[4];
                            for (int r = 0; r < 4; ++r) {
                                const int64_t y = row0 + 2 * tr + r - 1;
                                rows[r] = y >= 0 && y < 56 ? xc + y * 56 : zero_row;
                                /* the next channel's row, a plane away: too short a stream for the hardware
                                   prefetcher */
                                if (ch + 1 < 64 && rows[r] != zero_row)
                                    for (int64_t l = 0; l < 56; l += 16) __builtin_prefetch(rows[r] + 3136 + l);
                            }
                            const float* restrict d0 = rows[0];
                            const float* restrict d1 = rows[1];
                            const float* restrict d2 = rows[2];
                            const float* restrict d3 = rows[3];
                            float bt[4][58];
                            for (int64_t j = 0; j < 1; ++j) bt[0][j] = bt[1][j] = bt[2][j] = bt[3][j] = 0.0f;
                            for (int64_t j = 1; j < 57; ++j) {
                                const float a = d0[j - 1], b = d1[j - 1], c2 = d2[j - 1], e = d3[j - 1];
                                bt[0][j] = a - c2;
                                bt[1][j] = b + c2;
                                bt[2][j] = c2 - b;
                                bt[3][j] = b - e;
                            }
                            for (int64_t j = 57; j < 58; ++j) bt[0][j] = bt[1][j] = bt[2][j] = bt[3][j] = 0.0f;
                            for (int i = 0; i < 4; ++i) {
                                float* restrict v = wv + ((int64_t)(4 * i) * 64 + ch) * tiles + tr * 28;
                                const float* restrict row = bt[i];
                                for (int64_t tc = 0; tc < 28; ++tc) {
                                    const float* restrict q = row + 2 * tc;
                                    v[tc] = q[0] - q[2];
                                    v[64 * tiles + tc] = q[1] + q[2];
                                    v[128 * tiles + tc] = q[2] - q[1];
                                    v[192 * tiles + tc] = q[1] - q[3];
                                }
                            }
                        }
                    }
                    AF_PACKED_FOR(32);
                    for (int e = 0; e < 16; ++e)
                        af_sgemm_packed(tiles, mlen, 64, 1024, 1.0f, wv + (int64_t)e * 64 * tiles, 1, tiles,
                                        t_d_conv_3_winograd + e * 4096 + m0 * 64, wm + (int64_t)e * tiles * 64, 64);
                    /* A^T M A of each tile, over the channels */
                    const int64_t plane = (int64_t)tiles * 64;
                    for (int tr = 0; tr < trows; ++tr) {
                        const int second_row = 2 * tr + 1 < plen / 56;
                        for (int64_t tc = 0; tc < 28; ++tc) {
                            const float* restrict m = wm + (tr * 28 + tc) * 64;
                            float* restrict y0 = tile + ((int64_t)(2 * tr) * 56 + 2 * tc) * 64;
                            float* restrict y1 = y0 + 3584;
                            float a0[64], a1[64], b0[64], b1[64];
                            for (int64_t mi = 0; mi < mlen; ++mi) {
                                float s0[4], s1[4];
                                for (int j = 0; j < 4; ++j) {
                                    const float m1 = m[(4 + j) * plane + mi], m2 = m[(8 + j) * plane + mi];
                                    s0[j] = m[j * plane + mi] + m1 + m2;
                                    s1[j] = m1 - m2 - m[(12 + j) * plane + mi];
                                }
                                a0[mi] = s0[0] + s0[1] + s0[2];
                                a1[mi] = s0[1] - s0[2] - s0[3];
                                b0[mi] = s1[0] + s1[1] + s1[2];
                                b1[mi] = s1[1] - s1[2] - s1[3];
                            }
                            /* the tile's positions inside the output: the last row or column of an odd size has one */
                            for (int64_t mi = 0; mi < mlen; ++mi) y0[mi] = a0[mi];
                            if (2 * tc + 1 < 56)
                                for (int64_t mi = 0; mi < mlen; ++mi) y0[64 + mi] = a1[mi];
                            if (second_row) {
                                for (int64_t mi = 0; mi < mlen; ++mi) y1[mi] = b0[mi];
                                if (2 * tc + 1 < 56)
                                    for (int64_t mi = 0; mi < mlen; ++mi) y1[64 + mi] = b1[mi];
                            }
                        }
                    }
                }
                /* the tile is [positions x channels]: turned channel-major, so that the epilogue reads and
                   writes rows of positions in order */
                af_transpose(plen, mlen, tile, 64, c, 224);
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
                            const float v6 = c[mi * 224 + q * 56 + ow] + v5;
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
