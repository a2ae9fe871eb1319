// etforge: declarations only. TFLM's op resolver and micro_ops.h include TFLM's signal library
// headers, which the pinned source snapshot leaves out; the image registers no signal op, so the
// registration functions are declared (for the resolver's default arguments) and never defined.
#pragma once
#include "tensorflow/lite/micro/micro_common.h"

namespace tflite {
namespace tflm_signal {
TFLMRegistration* Register_RFFT();
TFLMRegistration* Register_RFFT_FLOAT();
TFLMRegistration* Register_RFFT_INT16();
TFLMRegistration* Register_RFFT_INT32();
}  // namespace tflm_signal
}  // namespace tflite
