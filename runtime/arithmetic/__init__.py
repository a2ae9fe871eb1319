"""The device's arithmetic, in numpy: what each int8 kernel computes, integer for integer.

TFLite's rounding primitives (``tflite_int``; a convolution's requantization in a few
whole-tensor passes: ``requantize_fused``), gemmlowp's fixed point (``fixedpoint``), the
device-exact references of quantized Edge ops (``device_ref``, its nonlinear and matrix rules
in ``device_ref_nonlinear``), and TFLM's arithmetic as a LiteRT rewrite (``tflm_arith``).
Pure functions of arrays and qparams: nothing here runs a program or imports another room.
"""
