# group g0 [multi_output]: 10 nodes; rules: none recorded
import triton
import triton.language as tl


@triton.jit
def k_g0(t_x, t_y, t_const_2, t_const_8, t_sub_12_out, t_transpose_11_out, BLOCK: tl.constexpr):
    # one program per BLOCK elements of the flattened output (105 elements); the tail is masked
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < 105
    i0 = offs // 35
    i1 = (offs // 7) % 5
    i2 = offs % 7
    i1_0 = offs // 15
    i1_1 = (offs // 5) % 3
    i1_2 = offs % 5
    v1 = tl.load(t_x + i0 * 35 + i1 * 7 + i2, mask=mask, other=0)
    v2 = tl.load(t_y + i1, mask=mask, other=0)
    v3 = v1 > v2
    v4 = v1 + v2
    v5 = tl.load(t_const_2 + 0)
    v6 = v4 * v5
    v7 = tl.where(v6 < 0.0, 0.0, v6)
    v8 = 0.5 * v4 * (1.0 + tl.erf(v4 * 0.7071067811865476))
    v9 = tl.where(v3, v7, v8)
    v10 = tl.load(t_const_8 + 0)
    v11 = v4 < v10
    v12 = v11.to(tl.float32)
    v13 = v9 - v12
    v14 = tl.load(t_x + i1_1 * 35 + i1_2 * 7 + i1_0, mask=mask, other=0)
    v15 = tl.load(t_y + i1_2, mask=mask, other=0)
    v16 = v14 > v15
    v17 = v14 + v15
    v18 = v17 * v5
    v19 = tl.where(v18 < 0.0, 0.0, v18)
    v20 = 0.5 * v17 * (1.0 + tl.erf(v17 * 0.7071067811865476))
    v21 = tl.where(v16, v19, v20)
    tl.store(t_sub_12_out + offs, v13, mask=mask)
    tl.store(t_transpose_11_out + offs, v21, mask=mask)


def launch(t_x, t_y, t_const_2, t_const_8, t_sub_12_out, t_transpose_11_out, BLOCK=128, num_warps=4):
    # the grid follows the block sizes: any configuration of the kernel's list runs (codegen/triton/configs.py)
    k_g0[(triton.cdiv(105, BLOCK),)](t_x, t_y, t_const_2, t_const_8, t_sub_12_out, t_transpose_11_out, BLOCK=BLOCK, num_warps=num_warps)
