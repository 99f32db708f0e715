/* CPU kernels of a compiled policy (rlq.deploy): one call runs every layer of the network on a batch.
 *
 * Why: an actor that acts one observation at a time is bound by weight bytes and per-call overhead, not by
 * arithmetic; a batch runs layer by layer on tiles of up to TILE rows, each weight block applied to every
 * row of the tile while it is in cache, each row computed exactly as it is alone. rlq's compressed layers store far fewer bytes than a dense matrix (a block-circulant layer one
 * B-vector per B x B block, a block-sparse one only its kept blocks), but PyTorch and ONNX Runtime expand
 * them back to dense. These loops read each layer in the form it is stored in.
 *
 * The Python side (rlq/deploy/runtime.py) packs every layer into the arrays below, checks every shape and
 * dtype, and passes one int64 "program": a header of HEADER_WORDS words, then OP_WORDS words per op, the
 * arrays given as data pointers (the Python object keeps them alive). C99 with GCC/Clang generic vectors
 * for the float accumulators (LANES lanes, summed in a fixed order: no fast-math needed). Intrinsics where
 * gcc 12 does not find the instruction: widening int8/int16 codes to floats (AVX2, AVX-512), and the int8
 * sums: a dense or block-sparse layer's codes stored in 64-byte blocks (16 rows x 4 inputs, or 8 x 8, 4 x 16)
 * that one multiply-add takes whole against the block's inputs repeated over the vector, so that no row
 * needs a sum across lanes (AVX-512 VNNI's vpdpbusd; on AVX2 without VNNI, vpmaddwd on codes widened to
 * int16), and the int8 frequency-domain sums, whose lanes are not one dot product. Every other machine runs
 * plain C loops that compute the same integers.
 *
 * Ops (word 0; words 1-3: n_in, n_out, activation; 4-6: sizes; 7-15: pointers):
 *   DENSE_F32   y = W x + b                      W float (n_out, in_pad), in_pad = word 4
 *   DENSE_I8    x -> u8 codes (per row, asymmetric: x ~ s (u - z)); y = s w_o (W u - z colsum) + b
 *               W int8 (n_out, in_pad), in_pad = word 4, row by row; or, where word 5 is 1 (few inputs), in
 *               16 x 4 blocks (n_out/16 block rows, padded, of in_pad/4 blocks, a block its 16 rows of 4
 *               codes); ptr 9 weight scales (n_out), ptr 10 colsum int32
 *   SPARSE_I8   the same arithmetic over blocks of R rows x K inputs (words 4, 5), word 6 block rows;
 *               ptr 11 rowptr int32 (block rows + 1), ptr 12 block column int32 (kept blocks); ptr 7 the
 *               kept values, per block row its kept blocks one after another, each R rows of K bytes
 *   CIRC_F32/I8/I16  block-circulant in the frequency domain, word 4 B, word 5 input blocks padded
 *               (p_pad), word 6 output blocks; ptr 7 the B-vectors' real DFTs (n_out/B, p_pad, B) in
 *               half-complex order [re_0, re_1..re_{h-1}, re_h, im_1..im_{h-1}] (h = B/2), as float, int8
 *               or int16 codes; ptr 9 scales (n_out/B, B) for codes; B x B tables (rlq/deploy/frequency.py):
 *               ptr 10 D, ptr 11 Ds (the input chunks' DFTs X = x D and their swapped form Xs = x Ds),
 *               ptr 12 Ea, ptr 13 Eb (the output chunk y = A Ea + Bs Eb from the folded lane sums);
 *               CIRC_I8 stores its codes as (n_out/B, p_pad/4, B, 4) and takes ptr 14, the int32 sums of
 *               the codes per block row and component (its input's zero point correction)
 *   AFFINE      y = clamp(x * scale + shift, lo, hi) per feature (SB3's action scaling); ptrs 7-10
 * Every op but AFFINE takes ptr 8 as its float bias (0: none).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DENSE_F32 = 1, DENSE_I8 = 2, SPARSE_I8 = 3, CIRC_F32 = 4, CIRC_I8 = 5, CIRC_I16 = 6, AFFINE = 7 };
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_TANH = 2 };
#define VERSION 1
#define HEADER_WORDS 8 /* version, n_ops, n_in, n_out, float words per buffer, byte words per buffer */
#define OP_WORDS 16
#define LANES 32 /* float lanes of one accumulator; layouts are padded to whole accumulators */

/* VL floats per machine vector; NV vectors per accumulator. Generic vectors of the machine's width stay in
 * registers (wider ones were spilled to the stack by gcc 12, and its int8 -> float conversion of them
 * went scalar: hence the two widening loads by intrinsics). */
#if defined(__AVX512F__)
#include <immintrin.h>
#define VL 16
#elif defined(__AVX2__)
#include <immintrin.h>
#define VL 8
#else
#define VL 4
#endif
#define NV (LANES / VL)
typedef float vfloat __attribute__((vector_size(VL * sizeof(float))));

static inline vfloat load_f32(const float *p) {
    vfloat v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void store_f32(float *p, vfloat v) { memcpy(p, &v, sizeof v); }

#if defined(__AVX512F__)
static inline vfloat load_i8(const int8_t *p) {
    return (vfloat)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vfloat load_i16(const int16_t *p) {
    return (vfloat)_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)p)));
}
#elif defined(__AVX2__)
static inline vfloat load_i8(const int8_t *p) {
    return (vfloat)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vfloat load_i16(const int16_t *p) {
    return (vfloat)_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#else
static inline vfloat load_i8(const int8_t *p) {
    float t[VL];
    for (int l = 0; l < VL; l++) t[l] = p[l];
    return load_f32(t);
}
static inline vfloat load_i16(const int16_t *p) {
    float t[VL];
    for (int l = 0; l < VL; l++) t[l] = p[l];
    return load_f32(t);
}
#endif

typedef struct {
    const int64_t *w;
} op_t;

/* scratch of one tile of up to TILE rows, row after row: float buffers (the current and next layer, the
 * inputs' DFTs) of fw floats a row, int32 sums of fw a row, byte codes of bw a row, and each row's input
 * scale and zero point */
typedef struct {
    float *cur, *nxt, *X, *Xs;
    uint8_t *u, *g, *h;
    int16_t *u16;
    int32_t *acc;
    float *s;
    int32_t *z;
    int64_t fw, bw;
} buffers_t;

#define PTR(op, k, type) ((type)(uintptr_t)(op).w[k])

static inline float lane_sum(const vfloat *a) {
    vfloat v = a[0];
    for (int k = 1; k < NV; k++) v += a[k];
    float s = 0.0f;
    for (int l = 0; l < VL; l++) s += v[l];
    return s;
}

static void activate(float *y, int64_t n, int64_t act) {
    if (act == ACT_RELU) {
        for (int64_t k = 0; k < n; k++) y[k] = y[k] > 0.0f ? y[k] : 0.0f;
    } else if (act == ACT_TANH) {
        for (int64_t k = 0; k < n; k++) y[k] = tanhf(y[k]);
    }
}

/* ------------------------------------------------------------------------------------------- dense fp32 */

/* Every kernel below runs a tile of nb rows (x and y `ld` floats apart) weight block by weight block: a block
 * of weights is loaded from memory once and applied to every row while it sits in L1, instead of the whole
 * matrix streaming through the cache once per row. Each row's arithmetic, and so its result, is what it is
 * alone. */
static void dense_f32(op_t op, int64_t nb, const float *restrict x, float *restrict y, int64_t ld) {
    const int64_t n_out = op.w[2], in_pad = op.w[4];
    const float *W = PTR(op, 7, const float *);
    int64_t o = 0;
    for (; o + 4 <= n_out; o += 4) { /* four rows share each load of x */
        const float *w0 = W + o * in_pad, *w1 = w0 + in_pad, *w2 = w1 + in_pad, *w3 = w2 + in_pad;
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + b * ld;
            vfloat a0[NV] = {{0}}, a1[NV] = {{0}}, a2[NV] = {{0}}, a3[NV] = {{0}};
            for (int64_t t = 0; t < in_pad; t += LANES)
                for (int k = 0; k < NV; k++) {
                    const int64_t e = t + k * VL;
                    const vfloat xv = load_f32(xb + e);
                    a0[k] += load_f32(w0 + e) * xv, a1[k] += load_f32(w1 + e) * xv;
                    a2[k] += load_f32(w2 + e) * xv, a3[k] += load_f32(w3 + e) * xv;
                }
            float *yb = y + b * ld;
            yb[o] = lane_sum(a0), yb[o + 1] = lane_sum(a1), yb[o + 2] = lane_sum(a2), yb[o + 3] = lane_sum(a3);
        }
    }
    for (; o < n_out; o++) {
        const float *w0 = W + o * in_pad;
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + b * ld;
            vfloat a0[NV] = {{0}};
            for (int64_t t = 0; t < in_pad; t += LANES)
                for (int k = 0; k < NV; k++) a0[k] += load_f32(w0 + t + k * VL) * load_f32(xb + t + k * VL);
            y[b * ld + o] = lane_sum(a0);
        }
    }
}

/* ------------------------------------------------------------------------------------------ int8 paths */

/* Quantize x (n values, zero-padded to n_pad) to uint8 codes u with x ~ s (u - z), as ONNX Runtime's
 * DynamicQuantizeLinear: s = (max(x, 0) - min(x, 0)) / 255, z = round(-min / s), u = round(x / s) + z, both
 * saturated to [0, 255], rounding half to even. An all-zero row gets s = 1, z = 0. */
static void quantize_row(const float *restrict x, int64_t n, int64_t n_pad, uint8_t *restrict u, float *scale,
                         int32_t *zero_point) {
    float lo_l[LANES] = {0}, hi_l[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES)
        for (int l = 0; l < LANES; l++) {
            const float v = x[t + l];
            lo_l[l] = v < lo_l[l] ? v : lo_l[l];
            hi_l[l] = v > hi_l[l] ? v : hi_l[l];
        }
    float lo = 0.0f, hi = 0.0f;
    for (int l = 0; l < LANES; l++) lo = lo_l[l] < lo ? lo_l[l] : lo, hi = hi_l[l] > hi ? hi_l[l] : hi;
    for (; t < n; t++) lo = x[t] < lo ? x[t] : lo, hi = x[t] > hi ? x[t] : hi;
    float s = (hi - lo) / 255.0f;
    if (!(s > 0.0f)) s = 1.0f;
    float z = rintf(-lo / s);
    z = z < 0.0f ? 0.0f : z > 255.0f ? 255.0f : z;
    for (int64_t k = 0; k < n; k++) {
        float v = rintf(x[k] / s) + z;
        v = v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
        u[k] = (uint8_t)v;
    }
    for (int64_t k = n; k < n_pad; k++) u[k] = 0;
    *scale = s;
    *zero_point = (int32_t)z;
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define HAVE_VNNI512 1
#endif
#if defined(__AVX2__) && !defined(HAVE_VNNI512)
/* Without VNNI, gcc vectorises the u8 x s8 sums below as 16-bit products widened one by one; AVX2's vpmaddwd
 * multiplies 16-bit pairs and adds each pair into an int32 lane in one instruction. The codes of each row are
 * widened to int16 once (scratch: nb rows of len), the weights as they are loaded. Integer sums: the same
 * result in any order. */
#define HAVE_MADD16 1

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i load_w16(const int8_t *p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)); }

#define DEFINE_DOT_MADD(ROWS)                                                                             \
    static inline void dot_madd_##ROWS(const int8_t *restrict W, int64_t stride, const int16_t *restrict x, \
                                       const uint8_t *restrict u, int64_t len, int32_t *restrict out) {   \
        const int64_t len16 = len / 16 * 16;                                                              \
        __m256i a[ROWS];                                                                                  \
        for (int r = 0; r < ROWS; r++) a[r] = _mm256_setzero_si256();                                     \
        for (int64_t k = 0; k < len16; k += 16) {                                                         \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + k));                              \
            for (int r = 0; r < ROWS; r++)                                                                \
                a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(xv, load_w16(W + r * stride + k)));       \
        }                                                                                                 \
        for (int r = 0; r < ROWS; r++) {                                                                  \
            int32_t t = hsum_i32(a[r]);                                                                   \
            for (int64_t k = len16; k < len; k++) t += (int32_t)u[k] * W[r * stride + k];                 \
            out[r] = t;                                                                                   \
        }                                                                                                 \
    }
DEFINE_DOT_MADD(4)
DEFINE_DOT_MADD(1)
#endif

/* rows [0, n) of W (row stride `stride`, `len` codes each) dotted with each of nb code rows (u, `ustride`
 * bytes apart), into acc (row b at acc + b * astride); `scratch`: nb * len int16 */
static void dot_rows_u8s8(const int8_t *restrict W, int64_t stride, int64_t n, const uint8_t *restrict u,
                          int64_t ustride, int64_t len, int64_t nb, int32_t *restrict acc, int64_t astride,
                          int16_t *restrict scratch) {
    int64_t o = 0;
#ifdef HAVE_MADD16
    for (int64_t b = 0; b < nb; b++)
        for (int64_t k = 0; k < len; k++) scratch[b * len + k] = u[b * ustride + k];
    int32_t out[4];
    for (; o + 4 <= n; o += 4)
        for (int64_t b = 0; b < nb; b++) {
            dot_madd_4(W + o * stride, stride, scratch + b * len, u + b * ustride, len, out);
            for (int r = 0; r < 4; r++) acc[b * astride + o + r] = out[r];
        }
    for (; o < n; o++)
        for (int64_t b = 0; b < nb; b++)
            dot_madd_1(W + o * stride, stride, scratch + b * len, u + b * ustride, len, acc + b * astride + o);
    return;
#else
    (void)scratch;
#endif
    for (; o + 4 <= n; o += 4) {
        const int8_t *w0 = W + o * stride, *w1 = w0 + stride, *w2 = w1 + stride, *w3 = w2 + stride;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *ub = u + b * ustride;
            int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int64_t k = 0; k < len; k++) {
                const int32_t v = ub[k];
                a0 += v * w0[k];
                a1 += v * w1[k];
                a2 += v * w2[k];
                a3 += v * w3[k];
            }
            int32_t *ab = acc + b * astride;
            ab[o] = a0, ab[o + 1] = a1, ab[o + 2] = a2, ab[o + 3] = a3;
        }
    }
    for (; o < n; o++) {
        const int8_t *w0 = W + o * stride;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *ub = u + b * ustride;
            int32_t a0 = 0;
            for (int64_t k = 0; k < len; k++) a0 += (int32_t)ub[k] * w0[k];
            acc[b * astride + o] = a0;
        }
    }
}

static void dequantize(const int32_t *restrict acc, const int32_t *restrict colsum, const float *restrict wscale,
                       float s, int32_t z, int64_t n, float *restrict y) {
    for (int64_t o = 0; o < n; o++) y[o] = (float)(acc[o] - z * colsum[o]) * (s * wscale[o]);
}

#if defined(HAVE_VNNI512)
/* the K input codes of block p (at column col[p], or p where col is NULL) repeated over 64 bytes */
static inline __m512i repeat_inputs(const uint8_t *restrict u, const int32_t *restrict col, int32_t p, int64_t K) {
    const uint8_t *x = u + (int64_t)(col ? col[p] : p) * K;
    if (K == 4) {
        int32_t v;
        memcpy(&v, x, sizeof v);
        return _mm512_set1_epi32(v);
    }
    if (K == 8) {
        long long v;
        memcpy(&v, x, sizeof v);
        return _mm512_set1_epi64(v);
    }
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)x));
}
#endif

#if defined(HAVE_VNNI512) || defined(HAVE_MADD16)
/* acc[r] = the sum of lanes[r per .. r per + per) for the first `rows` rows: a 64-byte block's row sums, its
 * rows' lanes one after another */
static inline void sum_row_lanes(const int32_t *restrict lanes, int64_t per, int64_t rows, int32_t *restrict acc) {
    for (int64_t r = 0; r < rows; r++) {
        int32_t t = 0;
        for (int64_t j = 0; j < per; j++) t += lanes[r * per + j];
        acc[r] = t;
    }
}
#endif

/* The sums of one block row of an int8 op into acc[0..rows): its blocks p0..p1, block p's R rows of K codes
 * at W + p R K (row r's K codes contiguous), each times the K input codes at u + col[p] K (a DENSE_I8 op
 * passes col = NULL: block p is at column p). Where a
 * block is 64 bytes (R K = 64, K = 4, 8 or 16) one vector multiply-add takes a whole block: the block's
 * codes against the K input codes repeated over the vector, lane j summing the products of bytes 4j..4j+3
 * (VNNI's vpdpbusd; without VNNI, vpmaddwd on the codes widened to int16, lane j bytes 2j, 2j+1), every
 * lane of a row summed at the end. Integer sums: the same result in any order. */
static void block_row_sums(const int8_t *restrict W, const int32_t *restrict col, int32_t p0, int32_t p1, int64_t R,
                           int64_t K, const uint8_t *restrict u, int64_t rows, int32_t *restrict acc) {
#if defined(HAVE_VNNI512)
    if (R * K == 64 && (K == 4 || K == 8 || K == 16)) {
        /* four independent sums, blocks taken four at a time, so that a multiply-add waits on none */
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        int32_t p = p0;
        for (; p + 4 <= p1; p += 4) {
            const int8_t *w = W + (int64_t)p * 64;
            a0 = _mm512_dpbusd_epi32(a0, repeat_inputs(u, col, p, K), _mm512_loadu_si512(w));
            a1 = _mm512_dpbusd_epi32(a1, repeat_inputs(u, col, p + 1, K), _mm512_loadu_si512(w + 64));
            a2 = _mm512_dpbusd_epi32(a2, repeat_inputs(u, col, p + 2, K), _mm512_loadu_si512(w + 128));
            a3 = _mm512_dpbusd_epi32(a3, repeat_inputs(u, col, p + 3, K), _mm512_loadu_si512(w + 192));
        }
        for (; p < p1; p++)
            a0 = _mm512_dpbusd_epi32(a0, repeat_inputs(u, col, p, K), _mm512_loadu_si512(W + (int64_t)p * 64));
        const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
        if (K == 4) { /* one lane a row */
            _mm512_mask_storeu_epi32(acc, (__mmask16)((1u << rows) - 1u), sum);
            return;
        }
        int32_t lanes[16];
        _mm512_storeu_si512(lanes, sum);
        sum_row_lanes(lanes, K / 4, rows, acc); /* a lane: 4 codes */
        return;
    }
#elif defined(HAVE_MADD16)
    if (R * K == 64 && (K == 4 || K == 8 || K == 16)) {
        __m256i a[4];
        for (int c = 0; c < 4; c++) a[c] = _mm256_setzero_si256();
        for (int32_t p = p0; p < p1; p++) {
            const uint8_t *x = u + (int64_t)(col ? col[p] : p) * K;
            __m128i pattern;
            if (K == 4) {
                int32_t v;
                memcpy(&v, x, sizeof v);
                pattern = _mm_set1_epi32(v);
            } else if (K == 8) {
                long long v;
                memcpy(&v, x, sizeof v);
                pattern = _mm_set1_epi64x(v);
            } else {
                pattern = _mm_loadu_si128((const __m128i *)x);
            }
            const __m256i xv = _mm256_cvtepu8_epi16(pattern);
            for (int c = 0; c < 4; c++)
                a[c] = _mm256_add_epi32(a[c], _mm256_madd_epi16(xv, load_w16(W + (int64_t)p * 64 + 16 * c)));
        }
        int32_t lanes[32];
        for (int c = 0; c < 4; c++) _mm256_storeu_si256((__m256i *)(lanes + 8 * c), a[c]);
        sum_row_lanes(lanes, K / 2, rows, acc); /* a lane: 2 codes */
        return;
    }
#endif
    for (int64_t r = 0; r < rows; r++) {
        int32_t t = 0;
        for (int32_t p = p0; p < p1; p++) {
            const uint8_t *x = u + (int64_t)(col ? col[p] : p) * K;
            const int8_t *w = W + ((int64_t)p * R + r) * K;
            for (int64_t k = 0; k < K; k++) t += (int32_t)x[k] * w[k];
        }
        acc[r] = t;
    }
}

static void dense_i8(op_t op, int64_t nb, const float *restrict x, float *restrict y, buffers_t *buf) {
    const int64_t n_in = op.w[1], n_out = op.w[2], in_pad = op.w[4], blocked = op.w[5], ld = buf->fw, bw = buf->bw;
    const int8_t *W = PTR(op, 7, const int8_t *);
    for (int64_t b = 0; b < nb; b++) quantize_row(x + b * ld, n_in, in_pad, buf->u + b * bw, buf->s + b, buf->z + b);
    if (blocked) { /* 16 x 4 blocks, block row after block row */
        for (int64_t r0 = 0; r0 < n_out; r0 += 16) {
            const int64_t rows = n_out - r0 < 16 ? n_out - r0 : 16;
            for (int64_t b = 0; b < nb; b++)
                block_row_sums(W + r0 * in_pad, NULL, 0, (int32_t)(in_pad / 4), 16, 4, buf->u + b * bw, rows,
                               buf->acc + b * ld + r0);
        }
    } else {
        dot_rows_u8s8(W, in_pad, n_out, buf->u, bw, in_pad, nb, buf->acc, ld, buf->u16);
    }
    for (int64_t b = 0; b < nb; b++)
        dequantize(buf->acc + b * ld, PTR(op, 10, const int32_t *), PTR(op, 9, const float *), buf->s[b], buf->z[b],
                   n_out, y + b * ld);
}

static void sparse_i8(op_t op, int64_t nb, const float *restrict x, float *restrict y, buffers_t *buf) {
    const int64_t n_in = op.w[1], n_out = op.w[2], R = op.w[4], K = op.w[5], n_rows = op.w[6];
    const int64_t ld = buf->fw, bw = buf->bw;
    const int8_t *values = PTR(op, 7, const int8_t *);
    const int32_t *rowptr = PTR(op, 11, const int32_t *), *col = PTR(op, 12, const int32_t *);
    for (int64_t b = 0; b < nb; b++)
        quantize_row(x + b * ld, n_in, ((n_in + K - 1) / K) * K, buf->u + b * bw, buf->s + b, buf->z + b);
    for (int64_t br = 0; br < n_rows; br++) {
        const int64_t r0 = br * R, rows = n_out - r0 < R ? n_out - r0 : R;
        for (int64_t b = 0; b < nb; b++)
            block_row_sums(values, col, rowptr[br], rowptr[br + 1], R, K, buf->u + b * bw, rows, buf->acc + b * ld + r0);
    }
    for (int64_t b = 0; b < nb; b++)
        dequantize(buf->acc + b * ld, PTR(op, 10, const int32_t *), PTR(op, 9, const float *), buf->s[b], buf->z[b],
                   n_out, y + b * ld);
}

/* ---------------------------------------------------------------------------- block-circulant, by DFT */

/* Everything below is compiled once per B (DEFINE_CIRCULANT), so that the B-long loops unroll; a chunk is
 * held in NB vectors of W = min(B, VL) floats.
 * chunk_dfts: X = the real DFT of every B-chunk of x (x_j D) and Xs = x_j Ds, the same with the real and
 *   imaginary parts of bins 1..h-1 swapped (zero at bins 0 and h), so that a block's complex product is
 *   two lane-wise multiply-adds: a += C X gives re*re at re slots and im*im at im slots, b += C Xs the
 *   cross products; both zero-padded to p_pad chunks.
 * block_output: one output chunk y = A Ea + Bs Eb + bias from its 2B components (A: lane sums of C X
 *   folded to the B components, Bs: of C Xs), the tables holding the complex combination and the IDFT.
 * circ_f32 / circ_i16: stored DFTs in float32 or int16 codes, the input's DFTs in float32.
 * circ_i8: int8 codes and the input's DFTs quantized per row to uint8 (x ~ s (u - z)), in the order
 *   [quad of chunks][component][chunk in quad], so that one vpdpbusd lane sums a component over 4 chunks:
 *   the stored codes are in the same order. */

#define I8_STEP 128 /* bytes of one int8 accumulator step: 32 int32 lanes, 4 codes each */

/* acc[r][0..LANES): row r's int32 lane sums of W * Xq, acc[r][LANES..2 LANES) of W * Xsq */
#define DEFINE_MAC_I8(ROWS)                                                                               \
    static void mac_i8_##ROWS(const int8_t *restrict W, int64_t len, const uint8_t *restrict Xq,          \
                              const uint8_t *restrict Xsq, int32_t acc[ROWS][2 * LANES]) {                \
        MAC_I8_BODY(ROWS)                                                                                 \
    }
#ifdef HAVE_VNNI512
#define MAC_I8_BODY(ROWS)                                                                                 \
    __m512i a[ROWS][2], b[ROWS][2];                                                                       \
    for (int r = 0; r < ROWS; r++)                                                                        \
        for (int k = 0; k < 2; k++) a[r][k] = _mm512_setzero_si512(), b[r][k] = _mm512_setzero_si512();   \
    for (int64_t t = 0; t < len; t += I8_STEP)                                                            \
        for (int k = 0; k < 2; k++) {                                                                     \
            const __m512i xq = _mm512_loadu_si512(Xq + t + 64 * k), xs = _mm512_loadu_si512(Xsq + t + 64 * k); \
            for (int r = 0; r < ROWS; r++) {                                                              \
                const __m512i w = _mm512_loadu_si512(W + r * len + t + 64 * k);                           \
                a[r][k] = _mm512_dpbusd_epi32(a[r][k], xq, w);                                            \
                b[r][k] = _mm512_dpbusd_epi32(b[r][k], xs, w);                                            \
            }                                                                                             \
        }                                                                                                 \
    for (int r = 0; r < ROWS; r++)                                                                        \
        for (int k = 0; k < 2; k++) {                                                                     \
            _mm512_storeu_si512(acc[r] + 16 * k, a[r][k]);                                                \
            _mm512_storeu_si512(acc[r] + LANES + 16 * k, b[r][k]);                                        \
        }
#elif defined(HAVE_MADD16)
/* one 16-code slice c of every I8_STEP at a time (lanes 4c..4c+3: vpmaddwd sums codes 2j, 2j+1 of lane
 * 4c + j / 2 in its int32 lane j), so that the 2 ROWS accumulators stay in registers */
#define MAC_I8_BODY(ROWS)                                                                                 \
    for (int c = 0; c < I8_STEP / 16; c++) {                                                              \
        __m256i a[ROWS], b[ROWS];                                                                         \
        for (int r = 0; r < ROWS; r++) a[r] = _mm256_setzero_si256(), b[r] = _mm256_setzero_si256();      \
        for (int64_t t = c * 16; t < len; t += I8_STEP) {                                                 \
            const __m256i xq = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(Xq + t)));         \
            const __m256i xs = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(Xsq + t)));        \
            for (int r = 0; r < ROWS; r++) {                                                              \
                const __m256i w = load_w16(W + r * len + t);                                              \
                a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(xq, w));                                  \
                b[r] = _mm256_add_epi32(b[r], _mm256_madd_epi16(xs, w));                                  \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < ROWS; r++) {                                                                  \
            int32_t ea[8], eb[8];                                                                         \
            _mm256_storeu_si256((__m256i *)ea, a[r]);                                                     \
            _mm256_storeu_si256((__m256i *)eb, b[r]);                                                     \
            for (int j = 0; j < 4; j++) {                                                                 \
                acc[r][4 * c + j] = ea[2 * j] + ea[2 * j + 1];                                            \
                acc[r][LANES + 4 * c + j] = eb[2 * j] + eb[2 * j + 1];                                    \
            }                                                                                             \
        }                                                                                                 \
    }
#else
#define MAC_I8_BODY(ROWS)                                                                                 \
    for (int r = 0; r < ROWS; r++) {                                                                      \
        int32_t *a = acc[r], *b = acc[r] + LANES;                                                         \
        for (int l = 0; l < LANES; l++) a[l] = 0, b[l] = 0;                                               \
        const int8_t *w = W + r * len;                                                                    \
        for (int64_t t = 0; t < len; t += I8_STEP)                                                        \
            for (int l = 0; l < LANES; l++)                                                               \
                for (int m = 0; m < 4; m++) {                                                             \
                    const int64_t e = t + 4 * l + m;                                                      \
                    a[l] += (int32_t)Xq[e] * w[e], b[l] += (int32_t)Xsq[e] * w[e];                        \
                }                                                                                         \
    }
#endif
DEFINE_MAC_I8(4)
DEFINE_MAC_I8(1)

/* x (n values) to uint8 codes with the scale and zero point given (quantize_row's rule) */
static void quantize_with(const float *restrict x, int64_t n, float s, float z, uint8_t *restrict u) {
    for (int64_t k = 0; k < n; k++) {
        float v = rintf(x[k] / s) + z;
        v = v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
        u[k] = (uint8_t)v;
    }
}

/* The frequency-domain multiply-accumulate for stored DFTs of type T (LOAD widens VL of them to floats):
 * ROWS output chunks at a time, 2 ROWS NV independent accumulators sharing each load of X and Xs;
 * acc[r][0..NV) is chunk r's a, acc[r][NV..2NV) its b. */
#define DEFINE_MAC(NAME, T, LOAD, ROWS)                                                                   \
    static inline void NAME(const T *restrict C, int64_t len, const float *restrict X,                    \
                            const float *restrict Xs, vfloat acc[ROWS][2 * NV]) {                         \
        for (int r = 0; r < ROWS; r++)                                                                    \
            for (int k = 0; k < 2 * NV; k++) acc[r][k] = (vfloat){0};                                     \
        for (int64_t t = 0; t < len; t += LANES)                                                          \
            for (int k = 0; k < NV; k++) {                                                                \
                const int64_t e = t + k * VL;                                                             \
                const vfloat xv = load_f32(X + e), xs = load_f32(Xs + e);                                 \
                for (int r = 0; r < ROWS; r++) {                                                          \
                    const vfloat w = LOAD(C + r * len + e);                                               \
                    acc[r][k] += w * xv, acc[r][NV + k] += w * xs;                                        \
                }                                                                                         \
            }                                                                                             \
    }
DEFINE_MAC(mac_f32_4, float, load_f32, 4)
DEFINE_MAC(mac_f32_1, float, load_f32, 1)
DEFINE_MAC(mac_i16_4, int16_t, load_i16, 4)
DEFINE_MAC(mac_i16_1, int16_t, load_i16, 1)

#define DFT_W(B) ((B) < VL ? (B) : VL)

#define DEFINE_CIRCULANT(B)                                                                               \
    typedef float vdft##B __attribute__((vector_size(DFT_W(B) * sizeof(float))));                        \
    enum { W##B = DFT_W(B), NB##B = B / DFT_W(B) };                                                       \
    static inline vdft##B load_dft##B(const float *p) {                                                   \
        vdft##B v;                                                                                        \
        memcpy(&v, p, sizeof v);                                                                          \
        return v;                                                                                         \
    }                                                                                                     \
    static void chunk_dfts_##B(const float *restrict x, int64_t n_blocks, int64_t p_pad,                  \
                               const float *restrict D, const float *restrict Ds, float *restrict X,      \
                               float *restrict Xs) {                                                      \
        /* even and odd n summed apart: four independent multiply-add chains instead of two */           \
        for (int64_t j = 0; j < n_blocks; j++) {                                                          \
            vdft##B a0[NB##B] = {{0}}, a1[NB##B] = {{0}}, s0[NB##B] = {{0}}, s1[NB##B] = {{0}};           \
            for (int n = 0; n < B; n += 2) {                                                              \
                const float x0 = x[j * B + n], x1 = x[j * B + n + 1];                                     \
                for (int k = 0; k < NB##B; k++) {                                                         \
                    a0[k] += x0 * load_dft##B(D + n * B + k * W##B);                                      \
                    a1[k] += x1 * load_dft##B(D + (n + 1) * B + k * W##B);                                \
                    s0[k] += x0 * load_dft##B(Ds + n * B + k * W##B);                                     \
                    s1[k] += x1 * load_dft##B(Ds + (n + 1) * B + k * W##B);                               \
                }                                                                                         \
            }                                                                                             \
            for (int k = 0; k < NB##B; k++) a0[k] += a1[k], s0[k] += s1[k];                               \
            memcpy(X + j * B, a0, sizeof a0);                                                             \
            memcpy(Xs + j * B, s0, sizeof s0);                                                            \
        }                                                                                                 \
        for (int64_t t = n_blocks * B; t < p_pad * B; t++) X[t] = 0.0f, Xs[t] = 0.0f;                     \
    }                                                                                                     \
    static void block_output_##B(const float *A, const float *restrict Ea, const float *restrict Eb,      \
                                 const float *bias, float *restrict y) {                                  \
        /* four independent chains (even and odd c, of A and of Bs), added at the end */                  \
        vdft##B o0[NB##B] = {{0}}, o1[NB##B] = {{0}}, o2[NB##B] = {{0}}, o3[NB##B] = {{0}};               \
        for (int c = 0; c < B; c += 2)                                                                    \
            for (int k = 0; k < NB##B; k++) {                                                             \
                o0[k] += A[c] * load_dft##B(Ea + c * B + k * W##B);                                       \
                o1[k] += A[c + 1] * load_dft##B(Ea + (c + 1) * B + k * W##B);                             \
                o2[k] += A[B + c] * load_dft##B(Eb + c * B + k * W##B);                                   \
                o3[k] += A[B + c + 1] * load_dft##B(Eb + (c + 1) * B + k * W##B);                         \
            }                                                                                             \
        for (int k = 0; k < NB##B; k++) {                                                                 \
            o0[k] += o1[k], o2[k] += o3[k], o0[k] += o2[k];                                               \
            if (bias) o0[k] += load_dft##B(bias + k * W##B);                                              \
        }                                                                                                 \
        memcpy(y, o0, sizeof o0);                                                                 \
    }                                                                                                     \
    /* float lane sums (a then b, NV vectors each) to 2B components, times the scale of each component */ \
    static void fold_f32_##B(const vfloat *acc, const float *scale, float *A) {                           \
        float lanes[2 * LANES];                                                                           \
        for (int k = 0; k < 2 * NV; k++) store_f32(lanes + k * VL, acc[k]);                               \
        for (int c = 0; c < 2 * B; c++) A[c] = 0.0f;                                                      \
        for (int half = 0; half < 2; half++)                                                              \
            for (int g = 0; g < LANES / B; g++)                                                           \
                for (int c = 0; c < B; c++) A[half * B + c] += lanes[half * LANES + g * B + c];           \
        if (scale)                                                                                        \
            for (int c = 0; c < B; c++) A[c] *= scale[c], A[B + c] *= scale[c];                           \
    }                                                                                                     \
    /* int32 lane sums to 2B components, dequantized: s w_c (sum - z colsum_c) */                         \
    static void fold_i32_##B(const int32_t *lanes, const int32_t *colsum, const float *scale, float s,    \
                             int32_t z, float *A) {                                                       \
        int32_t sums[2 * B] = {0};                                                                        \
        for (int half = 0; half < 2; half++)                                                              \
            for (int g = 0; g < LANES / B; g++)                                                           \
                for (int c = 0; c < B; c++) sums[half * B + c] += lanes[half * LANES + g * B + c];        \
        for (int c = 0; c < B; c++) {                                                                     \
            A[c] = (float)(sums[c] - z * colsum[c]) * (s * scale[c]);                                     \
            A[B + c] = (float)(sums[B + c] - z * colsum[c]) * (s * scale[c]);                             \
        }                                                                                                 \
    }                                                                                                     \
    /* codes [chunk][component] to [quad][component][chunk in quad] */                                   \
    static void interleave_##B(const uint8_t *restrict u, int64_t p_pad, uint8_t *restrict q) {           \
        for (int64_t j0 = 0; j0 < p_pad; j0 += 4)                                                         \
            for (int c = 0; c < B; c++)                                                                   \
                for (int m = 0; m < 4; m++) q[j0 * B + 4 * c + m] = u[(j0 + m) * B + c];                  \
    }                                                                                                     \
    DEFINE_CIRC_FLOAT(circ_f32_##B, B, float, mac_f32)                                                    \
    DEFINE_CIRC_FLOAT(circ_i16_##B, B, int16_t, mac_i16)                                                  \
    static void circ_i8_##B(op_t op, int64_t nb, const float *restrict x, float *restrict y, buffers_t *buf) { \
        const int64_t n_in = op.w[1], p_pad = op.w[5], n_blocks_out = op.w[6], len = p_pad * B;           \
        const int64_t ld = buf->fw, bw = buf->bw;                                                         \
        const int8_t *C = PTR(op, 7, const int8_t *);                                                     \
        const float *bias = PTR(op, 8, const float *), *scales = PTR(op, 9, const float *);               \
        const int32_t *colsum = PTR(op, 14, const int32_t *);                                             \
        for (int64_t b = 0; b < nb; b++) { /* each row's DFTs as codes, in the stored order */            \
            chunk_dfts_##B(x + b * ld, n_in / B, p_pad, PTR(op, 10, const float *),                        \
                           PTR(op, 11, const float *), buf->X, buf->Xs);                                  \
            quantize_row(buf->X, len, len, buf->u, buf->s + b, buf->z + b); /* Xs: the same values */     \
            interleave_##B(buf->u, p_pad, buf->g + b * bw);                                               \
            quantize_with(buf->Xs, len, buf->s[b], (float)buf->z[b], buf->u);                             \
            interleave_##B(buf->u, p_pad, buf->h + b * bw);                                               \
        }                                                                                                 \
        int32_t acc[4][2 * LANES];                                                                        \
        float A[2 * B];                                                                                   \
        for (int64_t i = 0; i < n_blocks_out;) {                                                          \
            const int rows = n_blocks_out - i >= 4 ? 4 : 1;                                               \
            for (int64_t b = 0; b < nb; b++) {                                                            \
                if (rows == 4)                                                                            \
                    mac_i8_4(C + i * len, len, buf->g + b * bw, buf->h + b * bw, acc);                    \
                else                                                                                      \
                    mac_i8_1(C + i * len, len, buf->g + b * bw, buf->h + b * bw, acc);                    \
                for (int r = 0; r < rows; r++) {                                                          \
                    fold_i32_##B(acc[r], colsum + (i + r) * B, scales + (i + r) * B, buf->s[b], buf->z[b], A); \
                    block_output_##B(A, PTR(op, 12, const float *), PTR(op, 13, const float *),           \
                                     bias ? bias + (i + r) * B : NULL, y + b * ld + (i + r) * B);         \
                }                                                                                         \
            }                                                                                             \
            i += rows;                                                                                    \
        }                                                                                                 \
    }

#define DEFINE_CIRC_FLOAT(NAME, B, T, MAC)                                                                \
    static void NAME(op_t op, int64_t nb, const float *restrict x, float *restrict y, buffers_t *buf) {   \
        const int64_t n_in = op.w[1], p_pad = op.w[5], n_blocks_out = op.w[6], len = p_pad * B;           \
        const int64_t ld = buf->fw;                                                                       \
        const T *C = PTR(op, 7, const T *);                                                               \
        const float *bias = PTR(op, 8, const float *), *scales = PTR(op, 9, const float *);               \
        for (int64_t b = 0; b < nb; b++)                                                                  \
            chunk_dfts_##B(x + b * ld, n_in / B, p_pad, PTR(op, 10, const float *),                        \
                           PTR(op, 11, const float *), buf->X + b * ld, buf->Xs + b * ld);                \
        vfloat acc[4][2 * NV];                                                                            \
        float A[2 * B];                                                                                   \
        for (int64_t i = 0; i < n_blocks_out;) {                                                          \
            const int rows = n_blocks_out - i >= 4 ? 4 : 1;                                               \
            for (int64_t b = 0; b < nb; b++) {                                                            \
                if (rows == 4)                                                                            \
                    MAC##_4(C + i * len, len, buf->X + b * ld, buf->Xs + b * ld, acc);                    \
                else                                                                                      \
                    MAC##_1(C + i * len, len, buf->X + b * ld, buf->Xs + b * ld, acc);                    \
                for (int r = 0; r < rows; r++) {                                                          \
                    fold_f32_##B(acc[r], scales ? scales + (i + r) * B : NULL, A);                        \
                    block_output_##B(A, PTR(op, 12, const float *), PTR(op, 13, const float *),           \
                                     bias ? bias + (i + r) * B : NULL, y + b * ld + (i + r) * B);         \
                }                                                                                         \
            }                                                                                             \
            i += rows;                                                                                    \
        }                                                                                                 \
    }

DEFINE_CIRCULANT(2)
DEFINE_CIRCULANT(4)
DEFINE_CIRCULANT(8)
DEFINE_CIRCULANT(16)
DEFINE_CIRCULANT(32)

typedef void (*circ_fn)(op_t, int64_t, const float *, float *, buffers_t *);

/* the kernel of a CIRC_* op for its B (the Python side admits only these B) */
static circ_fn circulant_kernel(int64_t kind, int64_t B) {
    static const circ_fn table[3][5] = {
        {circ_f32_2, circ_f32_4, circ_f32_8, circ_f32_16, circ_f32_32},
        {circ_i8_2, circ_i8_4, circ_i8_8, circ_i8_16, circ_i8_32},
        {circ_i16_2, circ_i16_4, circ_i16_8, circ_i16_16, circ_i16_32},
    };
    const int row = kind == CIRC_F32 ? 0 : kind == CIRC_I8 ? 1 : 2;
    const int col = B == 2 ? 0 : B == 4 ? 1 : B == 8 ? 2 : B == 16 ? 3 : B == 32 ? 4 : -1;
    return col < 0 ? NULL : table[row][col];
}

/* ----------------------------------------------------------------------------------------- the program */

static void add_bias(float *restrict y, const float *restrict bias, int64_t n) {
    if (bias)
        for (int64_t o = 0; o < n; o++) y[o] += bias[o];
}

static void affine(op_t op, const float *restrict x, float *restrict y) {
    const int64_t n = op.w[2];
    const float *scale = PTR(op, 7, const float *), *shift = PTR(op, 8, const float *);
    const float *lo = PTR(op, 9, const float *), *hi = PTR(op, 10, const float *);
    for (int64_t k = 0; k < n; k++) {
        const float v = x[k] * scale[k] + shift[k];
        y[k] = v < lo[k] ? lo[k] : v > hi[k] ? hi[k] : v;
    }
}

/* one op on the nb rows of a tile, from buf->cur to buf->nxt */
static void run_op(op_t op, int64_t nb, buffers_t *buf) {
    const int64_t kind = op.w[0], n_out = op.w[2], ld = buf->fw;
    const float *x = buf->cur;
    float *y = buf->nxt;
    switch (kind) {
    case DENSE_F32: dense_f32(op, nb, x, y, ld); break;
    case DENSE_I8: dense_i8(op, nb, x, y, buf); break;
    case SPARSE_I8: sparse_i8(op, nb, x, y, buf); break;
    case CIRC_F32:
    case CIRC_I8:
    case CIRC_I16: {
        circ_fn kernel = circulant_kernel(kind, op.w[4]);
        if (kernel) kernel(op, nb, x, y, buf);
        break;
    }
    case AFFINE:
        for (int64_t b = 0; b < nb; b++) affine(op, x + b * ld, y + b * ld);
        break;
    }
    for (int64_t b = 0; b < nb; b++) {
        if (kind == DENSE_F32 || kind == DENSE_I8 || kind == SPARSE_I8) add_bias(y + b * ld, PTR(op, 8, const float *), n_out);
        activate(y + b * ld, n_out, op.w[3]);
    }
}

/* nb observations through every op, layer by layer; the input of a dense op is zero-padded to its row stride */
static void run_tile(const int64_t *program, int64_t nb, const float *obs, float *out, buffers_t *buf) {
    const int64_t n_ops = program[1], n_in = program[2], n_out = program[3], ld = buf->fw;
    memset(buf->cur, 0, nb * ld * sizeof(float));
    for (int64_t b = 0; b < nb; b++) memcpy(buf->cur + b * ld, obs + b * n_in, n_in * sizeof(float));
    for (int64_t i = 0; i < n_ops; i++) {
        op_t op = {program + HEADER_WORDS + i * OP_WORDS};
        const int64_t in = op.w[1], kind = op.w[0];
        if (kind == DENSE_F32 || kind == DENSE_I8)
            for (int64_t b = 0; b < nb; b++)
                for (int64_t k = in; k < op.w[4]; k++) buf->cur[b * ld + k] = 0.0f;
        run_op(op, nb, buf);
        float *t = buf->cur;
        buf->cur = buf->nxt, buf->nxt = t;
    }
    for (int64_t b = 0; b < nb; b++) memcpy(out + b * n_out, buf->cur + b * ld, n_out * sizeof(float));
}

/* rows per tile: a tile's activations (TILE rows of a 2048-wide layer: 512 KiB of floats, 128 KiB of codes)
 * stay in L2 while each weight block is applied to all of them; a larger batch runs tile after tile */
#define TILE 64

/* the rows of x (batch x n_in floats) that hold NaN or an infinity */
static Py_ssize_t nonfinite_rows(const float *x, Py_ssize_t batch, int64_t n_in) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t b = 0; b < batch; b++) {
        int finite = 1;
        for (int64_t k = 0; k < n_in; k++) finite &= isfinite(x[b * n_in + k]) != 0;
        bad += !finite;
    }
    return bad;
}

static PyObject *forward(PyObject *self, PyObject *args) {
    unsigned long long program_ptr;
    Py_buffer obs, out;
    Py_ssize_t batch;
    if (!PyArg_ParseTuple(args, "Ky*w*n", &program_ptr, &obs, &out, &batch)) return NULL;
    const int64_t *program = (const int64_t *)(uintptr_t)program_ptr;
    PyObject *result = NULL;
    Py_ssize_t bad = 0;
    const int64_t n_in = program[2], n_out = program[3], width = program[4], nbytes = program[5];
    if (program[0] != VERSION) {
        PyErr_Format(PyExc_ValueError, "program version %lld, this kernel runs %d", (long long)program[0], VERSION);
    } else if (batch < 0 || obs.len < (Py_ssize_t)(batch * n_in * sizeof(float)) ||
               out.len < (Py_ssize_t)(batch * n_out * sizeof(float))) {
        PyErr_SetString(PyExc_ValueError, "observation or output buffer too small for the batch");
    } else if ((bad = nonfinite_rows((const float *)obs.buf, batch, n_in)) > 0) {
        result = PyLong_FromSsize_t(bad); /* refused whole: no kernel quantizes a non-finite value */
    } else {
        /* per row: 4 float buffers and an int32 one of fw, 3 byte ones of bw (each padded to 64 bytes, with
         * 64 bytes of slack after the last row); per tile: the rows' scales and zero points */
        const int64_t rows = batch < TILE ? (batch > 0 ? batch : 1) : TILE;
        const int64_t fw = (width + 15) / 16 * 16, bw = (nbytes + 63) / 64 * 64;
        const size_t fbytes = (size_t)(rows * fw) * sizeof(float) + 64, bbytes = (size_t)(rows * bw) + 64;
        const size_t sbytes = (size_t)rows * (sizeof(float) + sizeof(int32_t));
        char *mem = malloc(5 * fbytes + 5 * bbytes + sbytes); /* 2 bbytes: int16 codes */
        if (mem == NULL) {
            PyErr_NoMemory();
        } else {
            buffers_t buf = {(float *)mem, (float *)(mem + fbytes), (float *)(mem + 2 * fbytes),
                             (float *)(mem + 3 * fbytes), (uint8_t *)(mem + 5 * fbytes),
                             (uint8_t *)(mem + 5 * fbytes + bbytes), (uint8_t *)(mem + 5 * fbytes + 2 * bbytes),
                             (int16_t *)(mem + 5 * fbytes + 3 * bbytes), (int32_t *)(mem + 4 * fbytes),
                             (float *)(mem + 5 * fbytes + 5 * bbytes),
                             (int32_t *)(mem + 5 * fbytes + 5 * bbytes + rows * sizeof(float)), fw, bw};
            const float *x = (const float *)obs.buf;
            float *y = (float *)out.buf;
            Py_BEGIN_ALLOW_THREADS for (Py_ssize_t b = 0; b < batch; b += TILE) {
                buffers_t tile = buf;
                const int64_t nb = batch - b < TILE ? batch - b : TILE;
                run_tile(program, nb, x + b * n_in, y + b * n_out, &tile);
            }
            Py_END_ALLOW_THREADS free(mem);
            result = PyLong_FromLong(0);
        }
    }
    PyBuffer_Release(&obs);
    PyBuffer_Release(&out);
    return result;
}

/* 1 where block_row_sums takes a 64-byte block (16 x 4, 8 x 8, 4 x 16) in one vector multiply-add */
#if defined(HAVE_VNNI512) || defined(HAVE_MADD16)
#define VECTOR_I8_BLOCKS 1
#else
#define VECTOR_I8_BLOCKS 0
#endif

static PyObject *constants(PyObject *self, PyObject *args) {
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "VERSION", VERSION,
                         "HEADER_WORDS", HEADER_WORDS, "OP_WORDS", OP_WORDS, "LANES", LANES, "DENSE_F32",
                         DENSE_F32, "DENSE_I8", DENSE_I8, "SPARSE_I8", SPARSE_I8, "CIRC_F32", CIRC_F32,
                         "CIRC_I8", CIRC_I8, "CIRC_I16", CIRC_I16, "AFFINE", AFFINE, "ACT_RELU", ACT_RELU,
                         "ACT_TANH", ACT_TANH, "VECTOR_I8_BLOCKS", VECTOR_I8_BLOCKS);
}

static PyMethodDef methods[] = {
    {"forward", forward, METH_VARARGS,
     "forward(program_ptr, obs, out, batch): run a packed program on `batch` float32 rows of obs into out; "
     "return 0, or the number of rows holding NaN or an infinity, in which case nothing is computed."},
    {"constants", constants, METH_NOARGS, "constants(): the op codes and layout sizes this build uses."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_policy_kernels",
                                    "Compiled kernels of rlq.deploy's compiled policies, a batch per call.", -1, methods};

PyMODINIT_FUNC PyInit__policy_kernels(void) { return PyModule_Create(&module); }
