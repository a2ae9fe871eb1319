/* Flat-argument entry points over CMSIS-NN for tests/test_cortex_m_kernels.py and
 * tests/test_memory.py (ctypes).
 *
 * Each function passes its arguments to CMSIS-NN the way ExecuTorch's cortex_m op wrapper
 * (backends/cortex_m/ops/op_*.cpp) does: offsets are negated zero points where the wrapper negates
 * them, the add's left shift is 20, the mul's and avg pool's activation range is the int8 range.
 * quantize/dequantize/div are the wrappers' own scalar C loops (they call no CMSIS-NN function).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "arm_nnfunctions.h"

int shim_add(const int8_t *a, const int8_t *b, int32_t n, int32_t zp1, int32_t m1, int32_t s1, int32_t zp2,
             int32_t m2, int32_t s2, int32_t ozp, int32_t om, int32_t os, int32_t amin, int32_t amax, int8_t *out)
{
    return arm_elementwise_add_s8(a, b, -zp1, m1, s1, -zp2, m2, s2, 20, out, ozp, om, os, amin, amax, n);
}

int shim_mul(const int8_t *a, const int8_t *b, int32_t n, int32_t zp1, int32_t zp2, int32_t ozp, int32_t om,
             int32_t os, int8_t *out)
{
    return arm_elementwise_mul_s8(a, b, -zp1, -zp2, out, ozp, om, os, -128, 127, n);
}

int shim_conv(const int8_t *in, int32_t n, int32_t h, int32_t w, int32_t c, const int8_t *wt, int32_t o,
              int32_t kh, int32_t kw, int32_t ki, const int32_t *bias, int32_t oh, int32_t ow, int32_t sh,
              int32_t sw, int32_t ph, int32_t pw, int32_t dh, int32_t dw, int32_t in_off, int32_t out_off,
              const int32_t *mult, const int32_t *shift, int32_t amin, int32_t amax, int8_t *out)
{
    cmsis_nn_conv_params p;
    p.input_offset = in_off;
    p.output_offset = out_off;
    p.stride.h = sh;
    p.stride.w = sw;
    p.padding.h = ph;
    p.padding.w = pw;
    p.dilation.h = dh;
    p.dilation.w = dw;
    p.activation.min = amin;
    p.activation.max = amax;
    cmsis_nn_per_channel_quant_params q = {(int32_t *)mult, (int32_t *)shift};
    cmsis_nn_dims id = {n, h, w, c}, fd = {o, kh, kw, ki}, od = {n, oh, ow, o}, bd = {1, 1, 1, o};
    int32_t size = arm_convolve_wrapper_s8_get_buffer_size(&p, &id, &fd, &od);
    if (size < (1 << 20))
        size = 1 << 20; /* generous: the host (no DSP) sizes differ from the device's */
    cmsis_nn_context ctx = {malloc(size), size};
    int status = arm_convolve_wrapper_s8(&ctx, &p, &q, &id, in, &fd, wt, &bd, bias, &od, out);
    free(ctx.buf);
    return status;
}

int shim_dw(const int8_t *in, int32_t n, int32_t h, int32_t w, int32_t c, const int8_t *wt, int32_t kh, int32_t kw,
            int32_t co, const int32_t *bias, int32_t oh, int32_t ow, int32_t sh, int32_t sw, int32_t ph, int32_t pw,
            int32_t dh, int32_t dw, int32_t ch_mult, int32_t in_off, int32_t out_off, const int32_t *mult,
            const int32_t *shift, int32_t amin, int32_t amax, int8_t *out)
{
    cmsis_nn_dw_conv_params p;
    p.input_offset = in_off;
    p.output_offset = out_off;
    p.ch_mult = ch_mult;
    p.stride.h = sh;
    p.stride.w = sw;
    p.padding.h = ph;
    p.padding.w = pw;
    p.dilation.h = dh;
    p.dilation.w = dw;
    p.activation.min = amin;
    p.activation.max = amax;
    cmsis_nn_per_channel_quant_params q = {(int32_t *)mult, (int32_t *)shift};
    cmsis_nn_dims id = {n, h, w, c}, fd = {1, kh, kw, co}, od = {n, oh, ow, co}, bd = {1, 1, 1, co};
    int32_t size = arm_depthwise_conv_wrapper_s8_get_buffer_size(&p, &id, &fd, &od);
    if (size < (1 << 20))
        size = 1 << 20; /* generous: the host (no DSP) sizes differ from the device's */
    cmsis_nn_context ctx = {malloc(size), size};
    int status = arm_depthwise_conv_wrapper_s8(&ctx, &p, &q, &id, in, &fd, wt, &bd, bias, &od, out);
    free(ctx.buf);
    return status;
}

int shim_fc(const int8_t *in, int32_t batches, int32_t in_feat, const int8_t *wt, int32_t out_feat,
            const int32_t *bias, int32_t in_off, int32_t f_off, int32_t out_off, int32_t mult, int32_t shift,
            int32_t amin, int32_t amax, int8_t *out)
{
    cmsis_nn_context ctx = {NULL, 0};
    cmsis_nn_fc_params p;
    p.input_offset = in_off;
    p.filter_offset = f_off;
    p.output_offset = out_off;
    p.activation.min = amin;
    p.activation.max = amax;
    cmsis_nn_per_tensor_quant_params q = {mult, shift};
    cmsis_nn_dims id = {batches, 1, 1, in_feat}, fd = {in_feat, 1, 1, out_feat}, bd = {1, 1, 1, out_feat},
                  od = {batches, 1, 1, out_feat};
    return arm_fully_connected_s8(&ctx, &p, &q, &id, in, &fd, wt, &bd, bias, &od, out);
}

static void pool_setup(cmsis_nn_pool_params *p, int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t amin,
                       int32_t amax)
{
    p->stride.h = sh;
    p->stride.w = sw;
    p->padding.h = ph;
    p->padding.w = pw;
    p->activation.min = amin;
    p->activation.max = amax;
}

int shim_avgpool(const int8_t *in, int32_t n, int32_t h, int32_t w, int32_t c, int32_t oh, int32_t ow, int32_t kh,
                 int32_t kw, int32_t sh, int32_t sw, int32_t ph, int32_t pw, int8_t *out)
{
    cmsis_nn_pool_params p;
    pool_setup(&p, sh, sw, ph, pw, -128, 127);
    cmsis_nn_dims id = {n, h, w, c}, fd = {1, kh, kw, 1}, od = {n, oh, ow, c};
    int32_t size = arm_avgpool_s8_get_buffer_size(ow, c);
    cmsis_nn_context ctx = {malloc(size > 0 ? size : 4), size};
    int status = arm_avgpool_s8(&ctx, &p, &id, in, &fd, &od, out);
    free(ctx.buf);
    return status;
}

int shim_maxpool(const int8_t *in, int32_t n, int32_t h, int32_t w, int32_t c, int32_t oh, int32_t ow, int32_t kh,
                 int32_t kw, int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t amin, int32_t amax, int8_t *out)
{
    cmsis_nn_pool_params p;
    pool_setup(&p, sh, sw, ph, pw, amin, amax);
    cmsis_nn_dims id = {n, h, w, c}, fd = {1, kh, kw, 1}, od = {n, oh, ow, c};
    cmsis_nn_context ctx = {NULL, 0};
    return arm_max_pool_s8(&ctx, &p, &id, in, &fd, &od, out);
}

void shim_softmax(const int8_t *in, int32_t rows, int32_t row_size, int32_t mult, int32_t shift, int32_t diff_min,
                  int8_t *out)
{
    arm_softmax_s8(in, rows, row_size, mult, shift, diff_min, out);
}

int shim_bmm(const int8_t *lhs, int32_t batch, int32_t rows, int32_t inner, const int8_t *rhs, int32_t cols,
             int32_t lhs_off, int32_t rhs_off, int32_t out_off, int32_t mult, int32_t shift, int8_t *out)
{
    const cmsis_nn_dims ld = {1, batch, rows, inner}, rd = {1, batch, cols, inner}, od = {1, batch, rows, cols};
    const cmsis_nn_bmm_params p = {false, false, {lhs_off, rhs_off, out_off, {-128, 127}}};
    cmsis_nn_per_tensor_quant_params q = {mult, shift};
    int32_t size = arm_fully_connected_s8_get_buffer_size(&od);
    cmsis_nn_context ctx = {malloc(size > 0 ? size : 4), size};
    int status = arm_batch_matmul_s8(&ctx, &p, &q, &ld, lhs, &rd, rhs, &od, out);
    free(ctx.buf);
    return status;
}

int shim_pad(const int8_t *in, const int32_t *dims, const int32_t *pre, const int32_t *post, int32_t value,
             int8_t *out)
{
    cmsis_nn_dims id = {dims[0], dims[1], dims[2], dims[3]};
    cmsis_nn_dims a = {pre[0], pre[1], pre[2], pre[3]}, b = {post[0], post[1], post[2], post[3]};
    return arm_pad_s8(in, out, (int8_t)value, &id, &a, &b);
}

int shim_transpose(const int8_t *in, const int32_t *in_dims, const int32_t *out_dims, const uint32_t *perm,
                   int32_t rank, int8_t *out)
{
    cmsis_nn_dims id = {in_dims[0], in_dims[1], in_dims[2], in_dims[3]};
    cmsis_nn_dims od = {out_dims[0], out_dims[1], out_dims[2], out_dims[3]};
    const cmsis_nn_transpose_params p = {rank, perm};
    return arm_transpose_s8(in, out, &id, &od, &p);
}

int shim_minmax(int maximum, const int8_t *a, const int32_t *ad, const int8_t *b, const int32_t *bd, int8_t *out,
                const int32_t *od)
{
    cmsis_nn_dims x = {ad[0], ad[1], ad[2], ad[3]}, y = {bd[0], bd[1], bd[2], bd[3]}, z = {od[0], od[1], od[2], od[3]};
    return maximum ? arm_maximum_s8(NULL, a, &x, b, &y, out, &z) : arm_minimum_s8(NULL, a, &x, b, &y, out, &z);
}

/* op_quantize_per_tensor.cpp's scalar loop (int8). */
void shim_quantize(const float *in, int32_t n, double scale, int32_t zp, int32_t qmin, int32_t qmax, int8_t *out)
{
    float inv_scale = 1.0f / (float)scale;
    for (int32_t i = 0; i < n; i++)
    {
        int32_t q = zp + (int32_t)nearbyintf(inv_scale * in[i]);
        q = q < qmin ? qmin : q;
        q = q > qmax ? qmax : q;
        out[i] = (int8_t)q;
    }
}

/* op_dequantize_per_tensor.cpp's scalar loop (int8). */
void shim_dequantize(const int8_t *in, int32_t n, double scale, int32_t zp, float *out)
{
    for (int32_t i = 0; i < n; i++)
    {
        out[i] = (float)(((int32_t)in[i] - zp) * (float)scale);
    }
}

/* op_quantized_div.cpp's loop (int8). */
void shim_div(const int8_t *a, const int8_t *b, int32_t n, int32_t zp1, int32_t zp2, int32_t ozp, double scale,
              int8_t *out)
{
    const float s = (float)scale;
    for (int32_t i = 0; i < n; i++)
    {
        const int32_t num = (int32_t)a[i] - zp1;
        const int32_t den = (int32_t)b[i] - zp2;
        const float quotient = den != 0 ? (float)num / (float)den : 0.0f;
        const float scaled = roundf(quotient * s) + (float)ozp;
        const float clamped = fmaxf(-128.0f, fminf(127.0f, scaled));
        out[i] = (int8_t)clamped;
    }
}

int shim_tconv(const int8_t *in, int32_t n, int32_t h, int32_t w, int32_t c, const int8_t *wt, int32_t o, int32_t kh,
               int32_t kw, const int32_t *bias, int32_t oh, int32_t ow, int32_t sh, int32_t sw, int32_t ph, int32_t pw,
               int32_t oph, int32_t opw, int32_t in_off, int32_t out_off, const int32_t *mult, const int32_t *shift,
               int32_t amin, int32_t amax, int8_t *out)
{
    cmsis_nn_transpose_conv_params p;
    p.input_offset = in_off;
    p.output_offset = out_off;
    p.stride.h = sh;
    p.stride.w = sw;
    p.padding.h = ph;
    p.padding.w = pw;
    p.padding_offsets.h = oph;
    p.padding_offsets.w = opw;
    p.dilation.h = 1;
    p.dilation.w = 1;
    p.activation.min = amin;
    p.activation.max = amax;
    cmsis_nn_per_channel_quant_params q = {(int32_t *)mult, (int32_t *)shift};
    cmsis_nn_dims id = {n, h, w, c}, fd = {o, kh, kw, c}, od = {n, oh, ow, o}, bd = {1, 1, 1, o};
    int32_t size = arm_transpose_conv_s8_get_buffer_size(&p, &id, &fd, &od);
    int32_t osize = arm_transpose_conv_s8_get_reverse_conv_buffer_size(&p, &id, &fd);
    cmsis_nn_context ctx = {malloc(size + (1 << 20)), size + (1 << 20)};
    cmsis_nn_context octx = {malloc(osize + (1 << 20)), osize + (1 << 20)};
    int status = arm_transpose_conv_wrapper_s8(&ctx, &octx, &p, &q, &id, in, &fd, wt, &bd, bias, &od, out);
    free(ctx.buf);
    free(octx.buf);
    return status;
}

/* Scratch sizes, asked of CMSIS-NN the way the cortex_m op wrappers ask at run time
 * (op_quantized_{conv2d,depthwise_conv2d,avg_pool2d}.cpp under CORTEX_M_ENABLE_RUNTIME_CHECKS,
 * which fail the op unless the planned scratch has exactly this size). isa: 0 scalar (this plain C
 * build's generic function), 1 DSP, 2 MVE (CMSIS-NN's _dsp / _mve variants: what the generic
 * function returns when CMSIS-NN is built for that extension, which x86 cannot compile). */
int32_t size_conv(int32_t isa, int32_t n, int32_t h, int32_t w, int32_t c, int32_t o, int32_t kh, int32_t kw,
                  int32_t ki, int32_t oh, int32_t ow, int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t dh,
                  int32_t dw, int32_t in_off, int32_t out_off, int32_t amin, int32_t amax)
{
    cmsis_nn_conv_params p = {.input_offset = in_off, .output_offset = out_off, .stride = {.w = sw, .h = sh},
                              .padding = {.w = pw, .h = ph}, .dilation = {.w = dw, .h = dh},
                              .activation = {.min = amin, .max = amax}};
    cmsis_nn_dims id = {n, h, w, c}, fd = {o, kh, kw, ki}, od = {n, oh, ow, o};
    if (isa == 1)
        return arm_convolve_wrapper_s8_get_buffer_size_dsp(&p, &id, &fd, &od);
    if (isa == 2)
        return arm_convolve_wrapper_s8_get_buffer_size_mve(&p, &id, &fd, &od);
    return arm_convolve_wrapper_s8_get_buffer_size(&p, &id, &fd, &od);
}

int32_t size_dw(int32_t isa, int32_t n, int32_t h, int32_t w, int32_t c, int32_t kh, int32_t kw, int32_t oc,
                int32_t oh, int32_t ow, int32_t sh, int32_t sw, int32_t ph, int32_t pw, int32_t dh, int32_t dw,
                int32_t ch_mult, int32_t in_off, int32_t out_off, int32_t amin, int32_t amax)
{
    cmsis_nn_dw_conv_params p = {.input_offset = in_off, .output_offset = out_off, .ch_mult = ch_mult,
                                 .stride = {.w = sw, .h = sh}, .padding = {.w = pw, .h = ph},
                                 .dilation = {.w = dw, .h = dh}, .activation = {.min = amin, .max = amax}};
    cmsis_nn_dims id = {n, h, w, c}, fd = {1, kh, kw, oc}, od = {n, oh, ow, oc};
    if (isa == 1)
        return arm_depthwise_conv_wrapper_s8_get_buffer_size_dsp(&p, &id, &fd, &od);
    if (isa == 2)
        return arm_depthwise_conv_wrapper_s8_get_buffer_size_mve(&p, &id, &fd, &od);
    return arm_depthwise_conv_wrapper_s8_get_buffer_size(&p, &id, &fd, &od);
}

int32_t size_avgpool(int32_t isa, int32_t out_w, int32_t c)
{
    if (isa == 1)
        return arm_avgpool_s8_get_buffer_size_dsp(out_w, c);
    if (isa == 2)
        return arm_avgpool_s8_get_buffer_size_mve(out_w, c);
    return arm_avgpool_s8_get_buffer_size(out_w, c);
}
