/* autofusion C runtime: helpers shared by every generated kernel.
 *
 * The math helpers are branch-free so that GCC and Clang vectorise the loops that call them
 * (libm's expf/tanhf/erff are opaque calls and keep epilogue loops scalar). Accuracy against
 * numpy's float32 results: a few ULP (tested in tests/test_codegen_math.py).
 */
#ifndef AF_RUNTIME_H
#define AF_RUNTIME_H

#include <pthread.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* the instruction set this library is built for (AF_ISA, af_isa()): it picks the GEMM micro-kernels
   of af_sgemm.c.j2; autofusion/codegen/cores.py names the same four */
#if defined(__AVX512F__)
#define AF_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define AF_ISA "avx2"
#elif defined(__AVX__)
#define AF_ISA "avx"
#else
#define AF_ISA "portable"
#endif

#define AF_API __attribute__((visibility("default")))
#define AF_INTERNAL __attribute__((visibility("hidden")))
/* GCC 12 at -O3 -mavx2 vectorises Concat's if-converted per-index source select wrongly
   (docs/reliability.md): kernels that select a source per index are compiled without if-conversion */
#if defined(__GNUC__) && !defined(__clang__)
#define AF_NO_IF_CONVERT __attribute__((optimize("no-tree-loop-if-convert")))
#else
#define AF_NO_IF_CONVERT
#endif

/* Loop-nest kernels (pointwise, reductions) in 512-bit vectors where the CPU has them: GCC's default
   for AVX-512 CPUs is 256. The GEMM and convolution cores run 512-bit registers already (their
   intrinsics), so the CPU is at its AVX-512 clock either way. A GELU gradient 0.51 -> 0.32 ms,
   softmax rows 0.070 -> 0.060 (Xeon); GEMM epilogues were no faster and keep 256. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define AF_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))
#else
#define AF_WIDE_VECTORS
#endif

/* the sizes of this call of a library built for symbolic sizes (af_run_sized sets them; each kernel
   reads them into its own constants first) */
#define AF_MAX_SIZES 16
extern _Thread_local int64_t af_sizes[AF_MAX_SIZES];
#define AF_ALIGN_UP(n) ((((int64_t)(n)) + 63) / 64 * 64)
#define AF_PER_CHUNK(n, k) (((int64_t)(n)) / (k) > 1 ? ((int64_t)(n)) / (k) : 1)
#define AF_CEIL_DIV(a, b) ((((int64_t)(a)) + (int64_t)(b) - 1) / (int64_t)(b))

typedef union { float f; int32_t i; } af_f32bits;

/* 2^n for n in [-126, 127], built from the exponent bits. */
static inline float af_pow2i(int32_t n) {
    af_f32bits b;
    b.i = (n + 127) << 23;
    return b.f;
}

/* exp(x): Cephes range reduction and polynomial; overflow gives inf, NaN stays NaN. */
static inline float af_expf(float x) {
    const float hi = 88.72283935546875f, lo = -103.97208404541015625f;
    float xc = x > hi ? hi : (x < lo ? lo : x);
    float n = floorf(xc * 1.44269504088896341f + 0.5f);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1; /* two factors reach both 2^128 and the subnormals */
    float y = p * af_pow2i(n1) * af_pow2i(ni - n1);
    y = x > hi ? INFINITY : y;
    return x != x ? x : y;
}

/* tanh(x): odd polynomial near zero (Cephes), 1 - 2 / (exp(2|x|) + 1) elsewhere. */
static inline float af_tanhf(float x) {
    float ax = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                    + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    float e = af_expf(2.0f * (ax > 9.0f ? 9.0f : ax));
    float large = 1.0f - 2.0f / (e + 1.0f);
    large = ax > 9.0f ? 1.0f : large;
    large = copysignf(large, x);
    return ax < 0.625f ? small : large;
}

/* erf(x): rational approximation on [-4, 4] (erf is +-1 in float32 beyond). */
static inline float af_erff(float a) {
    float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * x;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return p / q;
}

static inline float af_sigmoidf(float x) { return 0.5f * (af_tanhf(0.5f * x) + 1.0f); }
static inline double af_sigmoid(double x) { return 0.5 * (tanh(0.5 * x) + 1.0); }

/* log(1 + exp(x)) without overflow, as numpy's logaddexp(0, x). */
static inline float af_softplusf(float x) { return (x > 0.0f ? x : 0.0f) + log1pf(af_expf(-fabsf(x))); }
static inline double af_softplus(double x) { return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x))); }

/* max/min that propagate NaN like numpy's maximum/minimum. */
static inline float af_maxf(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float af_minf(float a, float b) { return (a != a || a < b) ? a : b; }
static inline double af_max(double a, double b) { return (a != a || a > b) ? a : b; }
static inline double af_min(double a, double b) { return (a != a || a < b) ? a : b; }

/* Where on floats as a bitwise blend: GCC 12 will not vectorise `c ? x : y` in a loop that reads c as
   bytes and also sums in double (it turns the select into a masked load of no vector type). */
static inline float af_wheref(uint8_t c, float x, float y) {
    uint32_t ux, uy;
    memcpy(&ux, &x, 4);
    memcpy(&uy, &y, 4);
    uint32_t r = uy ^ ((ux ^ uy) & (0u - (uint32_t)(c != 0)));
    float out;
    memcpy(&out, &r, 4);
    return out;
}

/* Python's modulo (result has the divisor's sign), as numpy's mod. */
static inline float af_pymodf(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
static inline double af_pymod(double a, double b) {
    double r = fmod(a, b);
    return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
static inline int64_t af_pymodi(int64_t a, int64_t b) {
    if (b == 0) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t af_fmodi(int64_t a, int64_t b) { return b == 0 ? 0 : a % b; }
static inline int64_t af_divi(int64_t a, int64_t b) { return b == 0 ? 0 : a / b; }

/* Integer power by squaring; negative exponents give 0 except for bases 1 and -1. */
static inline int64_t af_powi(int64_t base, int64_t e) {
    if (e < 0) return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);
    int64_t r = 1;
    while (e) {
        if (e & 1) r *= base;
        base *= base;
        e >>= 1;
    }
    return r;
}

/* An index from data: negative counts from the end; clamped so a bad index cannot read outside. */
static inline int64_t af_wrap_index(int64_t i, int64_t n) {
    i = i < 0 ? i + n : i;
    return i < 0 ? 0 : (i >= n ? n - 1 : i);
}

/* Reflect / wrap an index into [0, n) (Pad's reflect and wrap modes). */
static inline int64_t af_reflect_index(int64_t i, int64_t n) {
    if (n == 1) return 0;
    int64_t period = 2 * (n - 1);
    i = i % period;
    i = i < 0 ? i + period : i;
    return i < n ? i : period - i;
}
static inline int64_t af_wrapmod_index(int64_t i, int64_t n) {
    i = i % n;
    return i < 0 ? i + n : i;
}

/* The calling thread's block for the kernel it is running (im2col block, tile, row): cache-line
   aligned, kept between kernels and runs and grown when a kernel needs more (defined once per library,
   in the SuperKernel's unit), so that no run pays for fresh pages. Callers carve it up; NULL only when
   memory runs out. */
AF_INTERNAL void* af_thread_block(size_t bytes);
AF_INTERNAL int64_t af_best_fit(int n, const int64_t* bytes, const int32_t* start, const int32_t* end,
                                int64_t* offset);

#endif /* AF_RUNTIME_H */
