/* The layer kernels of an exported policy: plain C99, no allocation, no library calls but tanhf.
 *
 * rlq.deploy.export_c copies this text into every policy.c it writes, after the weight arrays. Each kernel
 * computes what the NumPy forward of the same op in rlq/deploy/formats.py or rlq/deploy/frequency.py computes,
 * with float32 arithmetic in a fixed order (no vector extensions), so that the same source builds for a
 * host and for a Cortex-M.
 *
 * - rlq_dense_f32: y = W x + b, W row-major (n_out, n_in).
 * - rlq_dense_i8 / rlq_sparse_i8: int8 weight codes with one scale per output row; the input quantized per
 *   call to uint8 codes with its own scale s and zero point z (as ONNX Runtime's DynamicQuantizeLinear), an
 *   exact int32 sum of code products, dequantized once: y = (sum - z * colsum) * (s * scale) + b.
 *   The sparse kernel reads only the kept R x K blocks of each block row (rowptr, col: block-CSR).
 * - rlq_dense_lowbit: the same arithmetic over 2-7-bit codes packed into a bit stream, unpacked as read.
 * - rlq_circulant: a block-circulant layer as the half-complex real DFTs of its B-vectors (float32, int16 or
 *   int8 codes with one scale per block row and component): the input chunks' DFTs by a table, two
 *   multiply-adds per stored value (the real and the swapped spectrum), the inverse DFT by a second table
 *   (see rlq/deploy/frequency.py).
 * - rlq_affine: clip(x * scale + shift, low, high) per feature (SB3's action scaling).
 *
 * Rounding to codes is round-half-to-even (numpy's rint) by the float trick (v + 1.5 * 2^23) - 1.5 * 2^23,
 * exact for |v| < 2^22 in IEEE single precision without excess precision (FLT_EVAL_METHOD 0: x86-64 SSE,
 * ARM's single-precision FPU); the values rounded are codes before saturation, within [-256, 256].
 *
 * The generated file defines RLQ_USES_<KERNEL> for each kernel it calls, so that no unused static function
 * is compiled (-Wall -Werror); RLQ_USES_CODES where any op quantizes its input to uint8 codes.
 */

#define RLQ_RELU 1
#define RLQ_TANH 2

#ifdef RLQ_USES_CODES
static float rlq_rint(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (v + magic) - magic;
}

#endif

#if defined(RLQ_USES_CODES) || defined(RLQ_USES_AFFINE)
static float rlq_clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }
#endif

static void rlq_activate(float *y, int n, int activation) {
    int i;
    if (activation == RLQ_RELU) {
        for (i = 0; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    }
#ifdef RLQ_USES_TANH
    else if (activation == RLQ_TANH) {
        for (i = 0; i < n; i++) y[i] = tanhf(y[i]);
    }
#endif
}

#ifdef RLQ_USES_DENSE_F32
static void rlq_dense_f32(int n_in, int n_out, const float *w, const float *b, int activation,
                          const float *x, float *y) {
    int o, i;
    for (o = 0; o < n_out; o++) {
        /* eight partial sums, added in a fixed tree: a host compiler may keep them in one vector register,
         * a Cortex-M in eight float registers, without reordering any float addition */
        const float *row = w + (long)o * n_in;
        float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f, p4 = 0.0f, p5 = 0.0f, p6 = 0.0f, p7 = 0.0f, acc;
        for (i = 0; i + 8 <= n_in; i += 8) {
            p0 += row[i] * x[i];
            p1 += row[i + 1] * x[i + 1];
            p2 += row[i + 2] * x[i + 2];
            p3 += row[i + 3] * x[i + 3];
            p4 += row[i + 4] * x[i + 4];
            p5 += row[i + 5] * x[i + 5];
            p6 += row[i + 6] * x[i + 6];
            p7 += row[i + 7] * x[i + 7];
        }
        acc = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7));
        for (; i < n_in; i++) acc += row[i] * x[i];
        y[o] = b ? acc + b[o] : acc;
    }
    rlq_activate(y, n_out, activation);
}
#endif

#ifdef RLQ_USES_CODES
/* The input's uint8 codes, scale and zero point (rlq.deploy.formats.quantize_rows). */
static void rlq_quantize_input(const float *x, int n, uint8_t *u, float *scale, int32_t *zero) {
    float lo = 0.0f, hi = 0.0f, s, z;
    int i;
    for (i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    s = (hi - lo) / 255.0f;
    if (!(s > 0.0f)) s = 1.0f;
    z = rlq_clamp(rlq_rint(-lo / s), 0.0f, 255.0f);
    for (i = 0; i < n; i++) u[i] = (uint8_t)rlq_clamp(rlq_rint(x[i] / s) + z, 0.0f, 255.0f);
    *scale = s;
    *zero = (int32_t)z;
}

#endif

#ifdef RLQ_USES_DENSE_I8
static void rlq_dense_i8(int n_in, int n_out, const int8_t *w, const float *wscale, const int32_t *colsum,
                         const float *b, int activation, const float *x, float *y, uint8_t *u) {
    float s;
    int32_t z;
    int o, i;
    rlq_quantize_input(x, n_in, u, &s, &z);
    for (o = 0; o < n_out; o++) {
        const int8_t *row = w + (long)o * n_in;
        int32_t acc = 0;
        for (i = 0; i < n_in; i++) acc += (int32_t)u[i] * (int32_t)row[i];
        y[o] = (float)(acc - z * colsum[o]) * (s * wscale[o]);
        if (b) y[o] += b[o];
    }
    rlq_activate(y, n_out, activation);
}

#endif

#ifdef RLQ_USES_DENSE_LOWBIT
/* Code i of a little-endian stream of signed bits-bit codes (bits <= 8: it spans at most two bytes; the
 * stream holds one byte past its last code). */
static int32_t rlq_code(const uint8_t *stream, long i, int bits) {
    long bit = i * bits;
    uint32_t word = (uint32_t)stream[bit >> 3] | ((uint32_t)stream[(bit >> 3) + 1] << 8);
    int32_t v = (int32_t)((word >> (bit & 7)) & ((1u << bits) - 1u));
    return v >= (1 << (bits - 1)) ? v - (1 << bits) : v;
}

/* rlq_dense_i8's arithmetic over bits-bit codes packed row-major (rlq.deploy.formats.pack_codes). */
static void rlq_dense_lowbit(int n_in, int n_out, int bits, const uint8_t *stream, const float *wscale,
                             const int32_t *colsum, const float *b, int activation, const float *x, float *y,
                             uint8_t *u) {
    float s;
    int32_t z;
    int o, i;
    rlq_quantize_input(x, n_in, u, &s, &z);
    for (o = 0; o < n_out; o++) {
        int32_t acc = 0;
        for (i = 0; i < n_in; i++) acc += (int32_t)u[i] * rlq_code(stream, (long)o * n_in + i, bits);
        y[o] = (float)(acc - z * colsum[o]) * (s * wscale[o]);
        if (b) y[o] += b[o];
    }
    rlq_activate(y, n_out, activation);
}
#endif

#ifdef RLQ_USES_SPARSE_I8
/* w: per block row, its kept blocks one after another, each block its R rows of K codes. */
static void rlq_sparse_i8(int n_in, int n_out, int R, int K, int block_rows, const int8_t *w,
                          const int32_t *rowptr, const int32_t *col, const float *wscale,
                          const int32_t *colsum, const float *b, int activation, const float *x, float *y,
                          uint8_t *u) {
    float s;
    int32_t z;
    int br, r, p, k;
    rlq_quantize_input(x, n_in, u, &s, &z);
    for (br = 0; br < block_rows; br++) {
        int kept = rowptr[br + 1] - rowptr[br];
        const int8_t *base = w + (long)rowptr[br] * R * K;
        for (r = 0; r < R; r++) {
            int o = br * R + r;
            int32_t acc = 0;
            if (o >= n_out) break;
            for (p = 0; p < kept; p++) {
                int c0 = col[rowptr[br] + p] * K;
                const int8_t *row = base + ((long)p * R + r) * K;
                for (k = 0; k < K; k++) {
                    if (c0 + k < n_in) acc += (int32_t)u[c0 + k] * (int32_t)row[k];
                }
            }
            y[o] = (float)(acc - z * colsum[o]) * (s * wscale[o]);
            if (b) y[o] += b[o];
        }
    }
    rlq_activate(y, n_out, activation);
}

#endif

#ifdef RLQ_USES_CIRCULANT
#define RLQ_CIRC_F32 0
#define RLQ_CIRC_I16 1
#define RLQ_CIRC_I8 2

/* P x Q blocks of size B; w (P, Q, B) half-complex DFTs: float, int16 or int8 codes (kind); scale (P, B) for
 * codes. d: (B, B) forward table, X = x d (half-complex); Xs is X with the real and imaginary parts of bins
 * 1..h-1 swapped and bins 0 and h zero. Per output chunk the sums A = sum_j W_j X_j and Bs = sum_j W_j Xs_j
 * give Re Y_k = A_k - A_{h+k} (A_0, A_h at bins 0 and h) and Im Y_k = Bs_k + Bs_{h+k}; e: (B, B) inverse
 * table, y = Y e. Scratch: xf and xs Q*B floats, u 2*Q*B bytes (int8), acc 2*B floats. */
static void rlq_circulant(int P, int Q, int B, int kind, const void *w, const float *scale,
                          const int32_t *colsum, const float *d, const float *e, const float *b,
                          int activation, const float *x, float *y, float *xf, float *xs, uint8_t *u,
                          float *acc) {
    int i, j, c, n, h = B / 2;
    float s = 1.0f;
    int32_t z = 0;
    for (j = 0; j < Q; j++) {
        for (c = 0; c < B; c++) {
            float v = 0.0f;
            for (n = 0; n < B; n++) v += x[j * B + n] * d[n * B + c];
            xf[j * B + c] = v;
        }
        xs[j * B] = 0.0f;
        xs[j * B + h] = 0.0f;
        for (c = 1; c < h; c++) {
            xs[j * B + c] = xf[j * B + h + c];
            xs[j * B + h + c] = xf[j * B + c];
        }
    }
#ifdef RLQ_USES_CODES
    if (kind == RLQ_CIRC_I8) {
        /* codes of X; those of Xs are X's, swapped, and z at bins 0 and h (where Xs is 0) */
        rlq_quantize_input(xf, Q * B, u, &s, &z);
        for (j = 0; j < Q; j++) {
            uint8_t *us = u + Q * B + j * B;
            const uint8_t *ux = u + j * B;
            us[0] = (uint8_t)z;
            us[h] = (uint8_t)z;
            for (c = 1; c < h; c++) {
                us[c] = ux[h + c];
                us[h + c] = ux[c];
            }
        }
    }
#endif
    for (i = 0; i < P; i++) {
        for (c = 0; c < B; c++) {
            float a = 0.0f, bs = 0.0f;
            if (kind == RLQ_CIRC_I8) {
                const int8_t *wi = (const int8_t *)w + (long)i * Q * B;
                int32_t sa = 0, sb = 0;
                for (j = 0; j < Q; j++) {
                    sa += (int32_t)u[j * B + c] * (int32_t)wi[j * B + c];
                    sb += (int32_t)u[Q * B + j * B + c] * (int32_t)wi[j * B + c];
                }
                a = (float)(sa - z * colsum[i * B + c]) * (s * scale[i * B + c]);
                bs = (float)(sb - z * colsum[i * B + c]) * (s * scale[i * B + c]);
            } else if (kind == RLQ_CIRC_I16) {
                const int16_t *wi = (const int16_t *)w + (long)i * Q * B;
                for (j = 0; j < Q; j++) {
                    a += (float)wi[j * B + c] * xf[j * B + c];
                    bs += (float)wi[j * B + c] * xs[j * B + c];
                }
                a *= scale[i * B + c];
                bs *= scale[i * B + c];
            } else {
                const float *wi = (const float *)w + (long)i * Q * B;
                for (j = 0; j < Q; j++) {
                    a += wi[j * B + c] * xf[j * B + c];
                    bs += wi[j * B + c] * xs[j * B + c];
                }
            }
            acc[c] = a;
            acc[B + c] = bs;
        }
        /* the output chunk's half-complex spectrum Y, in place of A */
        for (c = 1; c < h; c++) {
            float re = acc[c] - acc[h + c];
            acc[h + c] = acc[B + c] + acc[B + h + c];
            acc[c] = re;
        }
        for (n = 0; n < B; n++) {
            float v = 0.0f;
            for (c = 0; c < B; c++) v += acc[c] * e[c * B + n];
            y[i * B + n] = b ? v + b[i * B + n] : v;
        }
    }
    rlq_activate(y, P * B, activation);
}
#endif

#ifdef RLQ_USES_AFFINE
static void rlq_affine(int n, const float *scale, const float *shift, const float *low, const float *high,
                       int activation, const float *x, float *y) {
    int i;
    for (i = 0; i < n; i++) y[i] = rlq_clamp(x[i] * scale[i] + shift[i], low[i], high[i]);
    rlq_activate(y, n, activation);
}
#endif
