/* k0_maxpool: MaxPool */
/* template opaque, kind single, 1 node(s) */
/* rules: fuse_opaque (rules/example.fuse:7) */
AF_INTERNAL void k0_maxpool(const float* restrict t_x, float* restrict t_maxpool_1_out, char* restrict scratch, int nt)
{
    (void)scratch;
    (void)nt;
    /* maxpool_1_out: [1, 64, 56, 56] */
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 112)
    for (int64_t o = 0; o < 3584; ++o) {
        const int64_t i1 = o / 56;
        const int64_t i2 = o % 56;
        for (int64_t i3 = 0; i3 < 56; ++i3) {
            float best1 = (-INFINITY);
            int64_t which2 = 0;
            for (int64_t tap3 = 0; tap3 < 9; ++tap3) {
                const int64_t kk4 = tap3 / 3;
                const int64_t kk5 = tap3 % 3;
                const int64_t at6 = i2 * 2 - 1 + kk4;
                const int64_t at7 = i3 * 2 - 1 + kk5;
                if (at6 >= 0 && at6 < 112 && at7 >= 0 && at7 < 112) {
                    const float v8 = t_x[i1 * 12544 + at6 * 112 + at7];
                    if (v8 > best1) { best1 = v8; which2 = tap3; }
                }
            }
            t_maxpool_1_out[i1 * 3136 + i2 * 56 + i3] = best1;
        }
    }
}
