/* Symmetric fake quantization of float32 rows in one pass per row (rlq.quant.tensor.fake_quantize_symmetric).
 *
 * Why: QAT fake-quantizes every weight each time it changes. In off-policy training (TD3: twin critics,
 * their targets, actor and target) that is about a dozen small tensors per step, and PyTorch's composition
 * (abs, amax, scale, divide, round, clamp, multiply, sign fix-up) costs a dozen ops each, mostly fixed
 * per-op overhead. Here each row costs two passes over its values.
 *
 * Per row (one row for a per-tensor scale): scale = max|x| / qmax (1 where that is 0), then
 *     out = clamp(round_half_even(x / scale), -qmax, qmax) * scale + 0.0f
 * The same IEEE float32 operations in the same order as rlq's PyTorch path, so the same bits: the final
 * + 0.0f turns -0.0 into +0.0 as the straight-through estimator's addition does there. Rounding adds and
 * subtracts 1.5 * 2^23, which rounds half to even in the default rounding mode for |v| < 2^22 (here
 * |v| <= qmax + 1 <= 2^15); the build disables contraction and fast math (setup.py) so it stays exact.
 * Returns -1 without writing a row that holds NaN or inf (the Python side raises, counting them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

static int fake_quant_rows(const float *restrict x, float *restrict out, int64_t rows, int64_t cols, float qmax) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * cols;
        float *oi = out + i * cols;
        float largest = 0.0f;
        int finite = 1;
        for (int64_t j = 0; j < cols; j++) {
            float a = fabsf(xi[j]);
            finite &= a <= 3.40282347e+38f; /* false for inf and NaN */
            largest = a > largest ? a : largest;
        }
        if (!finite) return -1;
        float scale = largest / qmax;
        if (scale == 0.0f) scale = 1.0f;
        for (int64_t j = 0; j < cols; j++) {
            float v = xi[j] / scale;
            v = (v + magic) - magic;
            v = v < -qmax ? -qmax : v;
            v = v > qmax ? qmax : v;
            oi[j] = v * scale + 0.0f;
        }
    }
    return 0;
}

static PyObject *fake_quant_rows_f32(PyObject *self, PyObject *args) {
    unsigned long long src, dst;
    long long rows, cols, qmax;
    if (!PyArg_ParseTuple(args, "KKLLL", &src, &dst, &rows, &cols, &qmax)) return NULL;
    if (rows < 0 || cols < 0 || qmax < 1 || qmax > 32767) {
        PyErr_SetString(PyExc_ValueError, "rows and cols must be non-negative and qmax in 1..32767");
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS status =
        fake_quant_rows((const float *)(uintptr_t)src, (float *)(uintptr_t)dst, rows, cols, (float)qmax);
    Py_END_ALLOW_THREADS return PyBool_FromLong(status == 0);
}

static PyMethodDef methods[] = {
    {"fake_quant_rows_f32", fake_quant_rows_f32, METH_VARARGS,
     "fake_quant_rows_f32(src_ptr, out_ptr, rows, cols, qmax) -> bool: fake-quantize float32 rows, each with "
     "its own symmetric scale; False (row left unwritten) where a row holds NaN or inf."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fake_quant_kernels",
                                    "Compiled symmetric fake quantization of float32 rows.", -1, methods};

PyMODINIT_FUNC PyInit__fake_quant_kernels(void) { return PyModule_Create(&module); }
