// etforge's ExecuTorch runner for the QEMU mps2-an505 image.
//
// Semihosting command line: <image> <model.pte> <samples>. For each sample s it reads input j
// from s<s>_in<j>.bin (raw bytes in the program's dim order), runs "forward" and writes output
// j to s<s>_out<j>.bin, all through semihosting file I/O relative to QEMU's working directory.
// Lines starting "etforge:" on stdout are the protocol the host reads (build.py/qemu.py):
// the planned buffers it allocated, the processor-clock ticks of each inference and, for the
// first sample, of each event ExecuTorch's event tracer profiles (one per instruction), "ok" last.
// A failure prints "etforge: error: ..." on stderr and never "ok".
//
// Memory: the planned arena is a static buffer sized by the generated etforge_model.h
// (kArenaBytes per memory id), not by the program; a program that plans more than the header
// says, or a kernel that writes past its planned buffer (guard bytes after each), fails.
//
// This file names no program: it is compiled once per library tree and linked into every
// image. What it needs of the program (the header's sizes, the arena storage, the kernel
// registration) comes from image_model.cpp, the one source compiled with the program's header
// (runner_image.h is the interface between the two).
#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "runner_image.h"

#ifndef ETFORGE_METHOD_POOL_BYTES
#define ETFORGE_METHOD_POOL_BYTES (1u << 20)
#endif
#ifndef ETFORGE_TEMP_POOL_BYTES
#define ETFORGE_TEMP_POOL_BYTES (1u << 20)
#endif
#define ETFORGE_MAX_IO 128  // inputs/outputs per program (the conformance programs batch many ops)

extern "C" void etforge_ticks_start(void);
extern "C" uint64_t etforge_ticks(void);

using namespace executorch::runtime;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::BufferDataLoader;
namespace image = ::etforge_image;
using image::arena_bytes;
using image::kAlign;
using image::kGuard;
using image::round_up;

namespace {

constexpr uint8_t kGuardByte = 0xA5;

alignas(16) uint8_t g_method_pool[ETFORGE_METHOD_POOL_BYTES];
alignas(16) uint8_t g_temp_pool[ETFORGE_TEMP_POOL_BYTES];

#define FAIL(...)                               \
  do {                                          \
    fprintf(stderr, "etforge: error: ");        \
    fprintf(stderr, __VA_ARGS__);               \
    fputc('\n', stderr);                        \
    return 1;                                   \
  } while (0)

int sh_get_cmdline(char* buf, int len) {
  struct {
    char* p;
    int n;
  } blk = {buf, len};
  register int r0 __asm("r0") = 0x15;  // SYS_GET_CMDLINE
  register void* r1 __asm("r1") = &blk;
  __asm volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  return r0 == 0 ? blk.n : -1;
}

uint8_t* read_file(const char* path, size_t* size, size_t align) {
  FILE* f = fopen(path, "rb");
  if (!f) return nullptr;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* buf = (uint8_t*)memalign(align, ((size_t)n + align - 1) / align * align + align);
  size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
  fclose(f);
  if (got != (size_t)n) return nullptr;
  *size = (size_t)n;
  return buf;
}

// Guard bytes after each planned buffer: any write there is outside ExecuTorch's plan.
int check_guards() {
  for (size_t i = 0; i < image::kNumArenas; ++i) {
    const uint8_t* g = image::planned[i].data() + round_up(arena_bytes(i));
    for (size_t k = 0; k < kGuard; ++k)
      if (g[k] != kGuardByte)
        FAIL("memory id %u: a kernel wrote past the planned buffer (%u bytes), at byte %u",
             (unsigned)(i + 1), (unsigned)arena_bytes(i), (unsigned)(round_up(arena_bytes(i)) + k));
  }
  return 0;
}

// Instructions per processor-clock tick, measured: a two-instruction loop of known length.
void calibrate() {
  uint32_t n = 500000;
  uint64_t t0 = etforge_ticks();
  __asm volatile("1: subs %0, %0, #1\n bne 1b" : "+r"(n) : : "cc");
  uint64_t t1 = etforge_ticks();
  printf("etforge: calibration %u instructions %llu ticks\n", 2u * 500000u, (unsigned long long)(t1 - t0));
}

// ExecuTorch's event tracer, reduced to what the per-op count needs: the ticks of each
// profiled event (OPERATOR_CALL, DELEGATE_CALL, ...) in execution order, for one inference.
class TickTracer final : public EventTracer {
 public:
  static constexpr size_t kMaxEvents = 2048;
  struct Event {
    const char* name;
    uint64_t ticks;
  };
  Event events[kMaxEvents];
  size_t count = 0;
  bool recording = false;

  void create_event_block(const char*) override {}
  EventTracerEntry start_profiling(const char* name, ChainID, DebugHandle) override {
    EventTracerEntry e{};
    e.event_id = -1;
    if (recording && count < kMaxEvents) {
      e.event_id = (int64_t)count;
      events[count++] = {name, 0};
    }
    e.start_time = etforge_ticks();
    return e;
  }
  void end_profiling(EventTracerEntry e) override {
    const uint64_t now = etforge_ticks();
    if (e.event_id >= 0) events[e.event_id].ticks = now - e.start_time;
  }
  EventTracerEntry start_profiling_delegate(const char*, DelegateDebugIntId) override { return EventTracerEntry{}; }
  void end_profiling_delegate(EventTracerEntry, const void*, size_t) override {}
  void log_profiling_delegate(const char*, DelegateDebugIntId, et_timestamp_t, et_timestamp_t, const void*,
                              size_t) override {}
  void track_allocation(AllocatorID, size_t) override {}
  AllocatorID track_allocator(const char*) override { return 0; }
  Result<bool> log_evalue(const EValue&, LoggedEValueType) override { return false; }
  Result<bool> log_intermediate_output_delegate(const char*, DelegateDebugIntId,
                                                const executorch::aten::Tensor&) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char*, DelegateDebugIntId,
                                                const ArrayRef<executorch::aten::Tensor>) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char*, DelegateDebugIntId, const int&) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char*, DelegateDebugIntId, const bool&) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char*, DelegateDebugIntId, const double&) override {
    return false;
  }
  void set_delegation_intermediate_output_filter(EventTracerFilterBase*) override {}
};

TickTracer g_tracer;

}  // namespace

// A delegate backend (an NPU runtime) linked into the image registers itself here; the base
// image has none, and the host refuses programs with delegates before building it.
extern "C" __attribute__((weak)) int etforge_register_delegates(void) { return 0; }

int main() {
  static char cmd[512];
  int n = sh_get_cmdline(cmd, sizeof(cmd) - 1);
  if (n <= 0) FAIL("no semihosting command line");
  cmd[n] = 0;
  char* argv[4] = {};
  int argc = 0;
  for (char* t = strtok(cmd, " "); t && argc < 4; t = strtok(nullptr, " ")) argv[argc++] = t;
  if (argc != 3) FAIL("usage: <image> <model.pte> <samples>");
  const char* pte_path = argv[1];
  const int samples = atoi(argv[2]);

  etforge_ticks_start();
  calibrate();
  runtime_init();
  if (image::register_kernels() != Error::Ok) FAIL("register_kernels() failed");
  if (etforge_register_delegates() != 0) FAIL("a delegate backend failed to register");

  size_t pte_size = 0;
  uint8_t* pte = read_file(pte_path, &pte_size, image::kPteAlignment > kAlign ? image::kPteAlignment : kAlign);
  if (!pte) FAIL("cannot read %s", pte_path);
  if (pte_size != image::kPteSize)
    FAIL("%s is %u bytes, etforge_model.h says %u: the header is not this program's", pte_path,
         (unsigned)pte_size, (unsigned)image::kPteSize);
  BufferDataLoader loader(pte, pte_size);
  Result<Program> program = Program::load(&loader, Program::Verification::InternalConsistency);
  if (!program.ok()) FAIL("Program::load failed (error 0x%x)", (unsigned)program.error());
  Result<MethodMeta> meta = program->method_meta(image::kMethodName);
  if (!meta.ok()) FAIL("no method %s (error 0x%x)", image::kMethodName, (unsigned)meta.error());
  for (size_t b = 0; b < meta->num_backends(); ++b) {
    const char* name = meta->get_backend_name(b).get();
    if (get_backend_class(name) == nullptr)
      FAIL("delegate backend %s has no runtime linked in this image", name);
  }

  const size_t planned = meta->num_memory_planned_buffers();
  if (planned != image::kNumArenas)
    FAIL("the program plans %u buffers, etforge_model.h sizes %u", (unsigned)planned,
         (unsigned)image::kNumArenas);
  uint8_t* p = image::arena;
  for (size_t i = 0; i < planned; ++i) {
    const size_t need = (size_t)meta->memory_planned_buffer_size(i).get();
    const size_t have = arena_bytes(i);
    printf("etforge: planned buffer %u %u bytes arena %u bytes\n", (unsigned)(i + 1), (unsigned)need, (unsigned)have);
    if (need > have)
      FAIL("memory id %u: ExecuTorch plans %u bytes, the image's arena (etforge_model.h kArenaBytes%s) holds %u",
           (unsigned)(i + 1), (unsigned)need, image::kArenaShrink ? ", shrunk by ETFORGE_ARENA_SHRINK" : "",
           (unsigned)have);
    memset(p, 0, round_up(have));
    memset(p + round_up(have), kGuardByte, kGuard);
    image::planned[i] = {p, have};
    p += round_up(have) + kGuard;
  }
  HierarchicalAllocator planned_memory({image::planned, planned});
  MemoryAllocator method_allocator(sizeof(g_method_pool), g_method_pool);
  MemoryAllocator temp_allocator(sizeof(g_temp_pool), g_temp_pool);
  MemoryManager memory_manager(&method_allocator, &planned_memory, &temp_allocator);
  Result<Method> method = program->load_method(image::kMethodName, &memory_manager, &g_tracer);
  if (!method.ok()) FAIL("load_method failed (error 0x%x; the [ET] log above says why)", (unsigned)method.error());
  printf("etforge: method allocator %u bytes\n", (unsigned)method_allocator.used_size());

  const size_t n_in = method->inputs_size();
  const size_t n_out = method->outputs_size();
  if (n_in > ETFORGE_MAX_IO || n_out > ETFORGE_MAX_IO) FAIL("more than %d inputs or outputs", ETFORGE_MAX_IO);
  alignas(TensorImpl) static uint8_t impl_storage[ETFORGE_MAX_IO][sizeof(TensorImpl)];
  char path[64];
  for (int s = 0; s < samples; ++s) {
    for (size_t i = 0; i < n_in; ++i) {
      Result<TensorInfo> tm = meta->input_tensor_meta(i);
      if (!tm.ok()) FAIL("input %u is not a tensor", (unsigned)i);
      snprintf(path, sizeof(path), "s%d_in%u.bin", s, (unsigned)i);
      size_t size = 0;
      uint8_t* data = read_file(path, &size, kAlign);
      if (!data) FAIL("cannot read %s", path);
      if (size != tm->nbytes())
        FAIL("%s: %u bytes, input %u takes %u", path, (unsigned)size, (unsigned)i, (unsigned)tm->nbytes());
      auto sizes = tm->sizes();
      auto dim_order = tm->dim_order();
      TensorImpl* impl = new (impl_storage[i])
          TensorImpl(tm->scalar_type(), sizes.size(), const_cast<TensorImpl::SizesType*>(sizes.data()), data,
                     const_cast<TensorImpl::DimOrderType*>(dim_order.data()));
      Error e = method->set_input(EValue(Tensor(impl)), i);
      if (e != Error::Ok) FAIL("set_input %u failed (error 0x%x)", (unsigned)i, (unsigned)e);
      free(data);
    }
    g_tracer.recording = true;  // per-op ticks (printed for the first sample), the failing op
    g_tracer.count = 0;
    const uint64_t t0 = etforge_ticks();
    Error e = method->execute();
    const uint64_t t1 = etforge_ticks();
    g_tracer.recording = false;
    if (e != Error::Ok) {
      // the instruction that failed: the last one the tracer saw start (events named *_CALL)
      long calls = -1;
      for (size_t k = 0; s == 0 && k < g_tracer.count; ++k) {
        const size_t n = strlen(g_tracer.events[k].name);
        if (n >= 5 && strcmp(g_tracer.events[k].name + n - 5, "_CALL") == 0) ++calls;
      }
      if (calls >= 0) printf("etforge: failed instruction %ld\n", calls);
      FAIL("sample %d: execute failed (error 0x%x)", s, (unsigned)e);
    }
    if (check_guards() != 0) return 1;
    printf("etforge: sample %d %llu ticks\n", s, (unsigned long long)(t1 - t0));
    for (size_t k = 0; s == 0 && k < g_tracer.count; ++k)
      printf("etforge: event %u %s %llu ticks\n", (unsigned)k, g_tracer.events[k].name,
             (unsigned long long)g_tracer.events[k].ticks);
    for (size_t j = 0; j < n_out; ++j) {
      const EValue& v = method->get_output(j);
      if (!v.isTensor()) FAIL("output %u is not a tensor", (unsigned)j);
      const Tensor t = v.toTensor();
      snprintf(path, sizeof(path), "s%d_out%u.bin", s, (unsigned)j);
      FILE* f = fopen(path, "wb");
      if (!f) FAIL("cannot write %s", path);
      size_t wrote = fwrite(t.const_data_ptr(), 1, t.nbytes(), f);
      fclose(f);
      if (wrote != t.nbytes()) FAIL("short write %s", path);
    }
  }
  printf("etforge: ok\n");
  return 0;
}
