/* Runs the etforge program "model" on the RT700's Cortex-M33 through its C API: init once,
 * then one inference per loop on the input buffer your sensor code fills. */
#include <stdint.h>

#include "model_api.h"

static uint8_t input[MODEL_NUM_INPUTS][MODEL_MAX_INPUT_BYTES] __attribute__((aligned(16)));
static uint8_t output[MODEL_NUM_OUTPUTS][MODEL_MAX_OUTPUT_BYTES] __attribute__((aligned(16)));
volatile etforge_status last_status;

int main(void) {
  last_status = model_init();
  if (last_status != ETFORGE_OK) {
    for (;;) {} /* model_last_error() says which ExecuTorch error */
  }
  const void* ins[MODEL_NUM_INPUTS];
  void* outs[MODEL_NUM_OUTPUTS];
  for (unsigned j = 0; j < MODEL_NUM_INPUTS; ++j) ins[j] = input[j];
  for (unsigned j = 0; j < MODEL_NUM_OUTPUTS; ++j) outs[j] = output[j];
  for (;;) {
    /* fill input[] here */
    last_status = model_run_buffers(ins, outs);
    /* use output[] here */
  }
}
