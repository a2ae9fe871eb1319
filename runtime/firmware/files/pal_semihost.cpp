// ExecuTorch's platform layer for the QEMU image: logs go to the host's stderr through
// semihosting, an abort exits QEMU with code 134, and time is the emulated instruction
// count read from SysTick (see runner.cpp), so ET_LOG timestamps are deterministic.
#include <executorch/runtime/platform/platform.h>

#include <cstdio>
#include <cstdlib>

extern "C" uint64_t etforge_ticks(void);

extern "C" {
void et_pal_init(void) {}
ET_NORETURN void et_pal_abort(void) {
  fflush(stdout);
  _Exit(134);
}
et_timestamp_t et_pal_current_ticks(void) { return etforge_ticks(); }
et_tick_ratio_t et_pal_ticks_to_ns_multiplier(void) { return {1, 1}; }
void et_pal_emit_log_message(et_timestamp_t, et_pal_log_level_t level, const char* filename,
                             const char* function, size_t line, const char* message, size_t) {
  fprintf(stderr, "[ET %c] %s:%u %s: %s\n", (char)level, filename, (unsigned)line, function, message);
}
void* et_pal_allocate(size_t size) { return malloc(size); }
void et_pal_free(void* ptr) { free(ptr); }
}
