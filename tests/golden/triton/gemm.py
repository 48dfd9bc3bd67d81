# group g0 [gemm_epilogue]: 3 nodes; rules: none recorded
import triton
import triton.language as tl


@triton.jit
def k_g0(t_a, t_const_1, t_const_2, t_relu_5_out, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # MatMul matmul_3: [2, 20, 18], K=24
    # one program per (batch, BM x BN tile); the epilogue runs on the accumulator tile before the store
    pid_b = tl.program_id(0)
    rm = tl.program_id(1) * BM + tl.arange(0, BM)
    rn = tl.program_id(2) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    b0 = pid_b
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, 24, BK):
        kk = k0 + rk
        amask = (rm[:, None] < 20) & (kk[None, :] < 24)
        bmask = (kk[:, None] < 24) & (rn[None, :] < 18)
        v1 = tl.load(t_a + b0 * 480 + (rm[:, None]) * 24 + kk[None, :], mask=amask, other=0)
        v2 = tl.load(t_const_1 + (kk[:, None]) * 18 + rn[None, :], mask=bmask, other=0)
        acc += tl.dot(v1, v2, input_precision="ieee")
    mask = (rm[:, None] < 20) & (rn[None, :] < 18)
    v3 = tl.load(t_const_2 + rn[None, :], mask=mask, other=0)
    v4 = acc + v3
    v5 = tl.where(v4 < 0.0, 0.0, v4)
    tl.store(t_relu_5_out + b0 * 360 + rm[:, None] * 18 + rn[None, :], v5, mask=mask)


def launch(t_a, t_const_1, t_const_2, t_relu_5_out, BM=32, BN=32, BK=32, num_warps=4):
    # the grid follows the block sizes: any configuration of the kernel's list runs (codegen/triton/configs.py)
    k_g0[(2, triton.cdiv(20, BM), triton.cdiv(18, BN),)](t_a, t_const_1, t_const_2, t_relu_5_out, BM=BM, BN=BN, BK=BK, num_warps=num_warps)
