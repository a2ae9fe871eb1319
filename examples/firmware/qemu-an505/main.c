/* Runs the etforge program "model" on QEMU's mps2-an505 through its C API only.
 * Semihosting command line: <samples>. For each sample s it reads input j from s<s>_in<j>.bin
 * (raw bytes in the program's dim order) and writes output j to s<s>_out<j>.bin, in QEMU's
 * working directory; "etforge: ok" is the last line of a good run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_api.h"

static int sh_get_cmdline(char* buf, int len) {
  struct {
    char* p;
    int n;
  } blk = {buf, len};
  register int r0 __asm("r0") = 0x15; /* SYS_GET_CMDLINE */
  register void* r1 __asm("r1") = &blk;
  __asm volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  return r0 == 0 ? blk.n : -1;
}

static int fail(const char* what, int status) {
  fprintf(stderr, "etforge: error: %s: status %d, ExecuTorch error 0x%x\n", what, status,
          (unsigned)model_last_error());
  return 1;
}

/* I/O buffers, 16-byte aligned, as the header asks */
static uint8_t in_buf[MODEL_NUM_INPUTS][MODEL_MAX_INPUT_BYTES] __attribute__((aligned(16)));
static uint8_t out_buf[MODEL_NUM_OUTPUTS][MODEL_MAX_OUTPUT_BYTES] __attribute__((aligned(16)));

int main(void) {
  char cmd[128];
  int n = sh_get_cmdline(cmd, sizeof(cmd) - 1);
  if (n < 0) n = 0;
  cmd[n] = 0;
  const char* arg = strrchr(cmd, ' ') ? strrchr(cmd, ' ') + 1 : cmd; /* QEMU puts the image name first */
  int samples = atoi(arg) > 0 ? atoi(arg) : 1;

  etforge_status st = model_init();
  if (st != ETFORGE_OK) return fail("model_init", st);
  for (size_t i = 0; i < MODEL_NUM_ARENAS; ++i)
    printf("etforge: planned buffer %u %u bytes\n", (unsigned)(i + 1), (unsigned)model_planned_bytes(i));
  printf("etforge: method pool used %u bytes\n", (unsigned)model_method_pool_used());

  const void* ins[MODEL_NUM_INPUTS];
  void* outs[MODEL_NUM_OUTPUTS];
  char path[32];
  for (int s = 0; s < samples; ++s) {
    for (size_t j = 0; j < MODEL_NUM_INPUTS; ++j) {
      snprintf(path, sizeof(path), "s%d_in%u.bin", s, (unsigned)j);
      FILE* f = fopen(path, "rb");
      if (!f || model_input_bytes[j] > sizeof(in_buf[j]) ||
          fread(in_buf[j], 1, model_input_bytes[j], f) != model_input_bytes[j]) {
        fprintf(stderr, "etforge: error: cannot read %u bytes from %s\n", (unsigned)model_input_bytes[j], path);
        return 1;
      }
      fclose(f);
      ins[j] = in_buf[j];
    }
    for (size_t j = 0; j < MODEL_NUM_OUTPUTS; ++j) outs[j] = out_buf[j];
    st = model_run_buffers(ins, outs);
    if (st != ETFORGE_OK) return fail("model_run", st);
    for (size_t j = 0; j < MODEL_NUM_OUTPUTS; ++j) {
      snprintf(path, sizeof(path), "s%d_out%u.bin", s, (unsigned)j);
      FILE* f = fopen(path, "wb");
      if (!f || fwrite(out_buf[j], 1, model_output_bytes[j], f) != model_output_bytes[j]) {
        fprintf(stderr, "etforge: error: cannot write %s\n", path);
        return 1;
      }
      fclose(f);
    }
  }
  printf("etforge: ok\n");
  return 0;
}
