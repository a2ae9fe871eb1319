// etforge's CPU stand-in for NPU partitions: an ExecuTorch delegate backend ("EtforgeNpuBackend")
// that runs a host-only partition (etforge's "ETFG" payload, format litert-host-v1: a LiteRT
// flatbuffer, no Neutron microcode) in TensorFlow Lite Micro with CMSIS-NN kernels on the
// Cortex-M33. It is NOT the NPU: it is linked only when the build opts in (ETFORGE_TFLM_PARTITIONS,
// `etforge run/verify --cpu-partitions`), and says so on its log lines.
//
// Payload: "ETFG", u32 LE header length, JSON header (etforge core/litert/payload.py: sorted keys,
// "format", "size", "input_dim_orders", "output_dim_orders"), zero padding to 16 bytes, the model.
// I/O: each tensor is copied between ExecuTorch's dim order and the order the payload states for
// the LiteRT tensor (a plain copy when they agree).
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/platform/log.h>

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_op_resolver.h"
#include "tensorflow/lite/schema/schema_generated.h"

// The program's part, generated (tflm.py resolver_source: etforge_tflm_ops.cpp, compiled with
// the TFLM kernels): this file is then the same for every program and compiles once.
extern const unsigned etforge_tflm_num_partitions;
extern const unsigned etforge_tflm_arena_bytes[];  // per partition, program order
const tflite::MicroOpResolver& etforge_tflm_resolver();

#define ETFORGE_TFLM_MAX_IO 8
#define ETFORGE_TFLM_MAX_DIMS 8

using namespace executorch::runtime;

namespace {

bool g_state_on_heap = false;  // set by etforge_tflm_register (below)

struct Orders {
  int count = 0;
  int rank[ETFORGE_TFLM_MAX_IO] = {};
  int order[ETFORGE_TFLM_MAX_IO][ETFORGE_TFLM_MAX_DIMS] = {};
};

struct Partition {
  tflite::MicroInterpreter* interp;
  uint8_t* arena;
  Orders in, out;
  int index;
};

// `"key": [[0, 2, 3, 1], [0, 1]]` inside the header's first `n` bytes.
bool parse_orders(const char* h, size_t n, const char* key, Orders* o) {
  const char* k = strstr(h, key);
  if (k == nullptr || k >= h + n) return false;
  const char* p = strchr(k, '[');
  if (p == nullptr) return false;
  ++p;
  int depth = 1, cur = -1;
  while (p < h + n && depth > 0) {
    if (*p == '[') {
      if (o->count >= ETFORGE_TFLM_MAX_IO) return false;
      cur = o->count++;
      ++depth;
    } else if (*p == ']') {
      --depth;
    } else if (*p >= '0' && *p <= '9') {
      if (cur < 0 || o->rank[cur] >= ETFORGE_TFLM_MAX_DIMS) return false;
      o->order[cur][o->rank[cur]++] = (int)strtol(p, (char**)&p, 10);
      continue;
    }
    ++p;
  }
  return depth == 0;
}

const uint8_t* unpack(const uint8_t* p, size_t n, Partition* part) {
  if (n < 8 || memcmp(p, "ETFG", 4) != 0) return nullptr;
  uint32_t hl;
  memcpy(&hl, p + 4, 4);
  if (8 + (size_t)hl > n) return nullptr;
  const char* h = (const char*)p + 8;
  const char* fmt = strstr(h, "\"format\": \"litert-host-v1\"");
  const char* sz = strstr(h, "\"size\": ");
  if (fmt == nullptr || sz == nullptr || fmt >= h + hl || sz >= h + hl) return nullptr;
  if (!parse_orders(h, hl, "\"input_dim_orders\"", &part->in) ||
      !parse_orders(h, hl, "\"output_dim_orders\"", &part->out))
    return nullptr;
  const size_t size = strtoul(sz + 8, nullptr, 10);
  const size_t start = (8 + (size_t)hl + 15) & ~(size_t)15;
  return start + size <= n ? p + start : nullptr;
}

// Copy between ExecuTorch's layout of `t` (its dim order) and a buffer laid out in `order`.
void copy_between(const executorch::aten::Tensor& t, const int* order, int rank, uint8_t* buf, bool to_buf) {
  const int dim = (int)t.dim();
  const size_t es = t.element_size();
  uint8_t* et = (uint8_t*)t.const_data_ptr();
  bool same = rank == dim;
  for (int i = 0; same && i < dim; ++i) same = order[i] == (int)t.dim_order()[i];
  if (same || dim == 0) {
    to_buf ? memcpy(buf, et, t.nbytes()) : memcpy(et, buf, t.nbytes());
    return;
  }
  size_t s_et[ETFORGE_TFLM_MAX_DIMS], s_buf[ETFORGE_TFLM_MAX_DIMS], step = 1;
  for (int i = dim - 1; i >= 0; --i) { s_et[t.dim_order()[i]] = step; step *= t.size(t.dim_order()[i]); }
  step = 1;
  for (int i = dim - 1; i >= 0; --i) { s_buf[order[i]] = step; step *= t.size(order[i]); }
  size_t c[ETFORGE_TFLM_MAX_DIMS] = {};
  for (ssize_t n = 0; n < t.numel(); ++n) {
    size_t a = 0, b = 0;
    for (int d = 0; d < dim; ++d) { a += c[d] * s_et[d]; b += c[d] * s_buf[d]; }
    to_buf ? memcpy(buf + b * es, et + a * es, es) : memcpy(et + a * es, buf + b * es, es);
    for (int d = dim - 1; d >= 0; --d) { if (++c[d] < (size_t)t.size(d)) break; c[d] = 0; }
  }
}

int g_partitions = 0;

class TflmPartitions final : public BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec>) const override {
    // a firmware's C API sizes its method pool for ExecuTorch alone: there the stand-in's state
    // goes on the heap with its arena (g_state_on_heap); etforge's runner gives it pool memory
    auto* a = context.get_runtime_allocator();
    Partition* part = g_state_on_heap ? static_cast<Partition*>(memalign(alignof(Partition), sizeof(Partition)))
                                      : a->allocateInstance<Partition>();
    if (part == nullptr) return Error::DelegateMemoryAllocationFailed;
    new (part) Partition();
    const uint8_t* model = unpack((const uint8_t*)processed->data(), processed->size(), part);
    if (model == nullptr) {
      ET_LOG(Error, "EtforgeNpuBackend (TFLM on the CPU): not a litert-host-v1 payload; Neutron microcode runs on the NPU only");
      return Error::DelegateInvalidCompatibility;
    }
    if (((uintptr_t)model & 15) != 0) return Error::DelegateInvalidCompatibility;
    // the interpreter reads the weights in place: `processed` is kept
    part->index = g_partitions++;  // ExecuTorch initialises delegates in program order
    if (part->index >= (int)etforge_tflm_num_partitions) return Error::DelegateInvalidCompatibility;
    const unsigned arena_bytes = etforge_tflm_arena_bytes[part->index];  // computed at compile time
    part->arena = (uint8_t*)memalign(16, arena_bytes);
    void* mem = g_state_on_heap ? memalign(alignof(tflite::MicroInterpreter), sizeof(tflite::MicroInterpreter))
                                : a->allocate(sizeof(tflite::MicroInterpreter), alignof(tflite::MicroInterpreter));
    if (part->arena == nullptr || mem == nullptr) return Error::DelegateMemoryAllocationFailed;
    part->interp = new (mem) tflite::MicroInterpreter(tflite::GetModel(model), etforge_tflm_resolver(), part->arena,
                                                      arena_bytes);
    if (part->interp->AllocateTensors() != kTfLiteOk) {
      ET_LOG(Error, "EtforgeNpuBackend (TFLM on the CPU): partition %d: AllocateTensors failed in the "
             "compile-time arena of %u bytes (plugins/targets/tflm_arena.py)", part->index, arena_bytes);
      return Error::DelegateInvalidCompatibility;
    }
    if ((int)part->interp->inputs_size() != part->in.count || (int)part->interp->outputs_size() != part->out.count)
      return Error::DelegateInvalidCompatibility;
    printf("etforge: tflm partition %d arena %u bytes used %u bytes\n", part->index, arena_bytes,
           (unsigned)part->interp->arena_used_bytes());
    return part;
  }

  Error execute(BackendExecutionContext&, DelegateHandle* handle, Span<EValue*> args) const override {
    auto* part = static_cast<Partition*>(handle);
    auto* it = part->interp;
    const size_t ni = it->inputs_size(), no = it->outputs_size();
    if (args.size() != ni + no) return Error::InvalidArgument;
    for (size_t i = 0; i < ni; ++i) {
      const auto& t = args[i]->toTensor();
      TfLiteTensor* x = it->input(i);
      if (t.nbytes() != x->bytes) return Error::InvalidArgument;
      copy_between(t, part->in.order[i], part->in.rank[i], (uint8_t*)x->data.raw, true);
    }
    if (it->Invoke() != kTfLiteOk) return Error::Internal;
    for (size_t j = 0; j < no; ++j) {
      const auto& t = args[ni + j]->toTensor();
      const TfLiteTensor* y = it->output(j);
      if (t.nbytes() != y->bytes) return Error::InvalidArgument;
      copy_between(t, part->out.order[j], part->out.rank[j], (uint8_t*)y->data.raw, false);
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* handle) const override {
    auto* part = static_cast<Partition*>(handle);
    part->interp->~MicroInterpreter();
    free(part->arena);
    if (g_state_on_heap) {
      free(part->interp);
      free(part);
    }
  }
};

TflmPartitions g_backend;

}  // namespace

// Registers the backend; state_on_heap: where init puts each partition's state (above). A
// firmware of the CMake package (etforge_add_runtime, ETFORGE_CPU_PARTITIONS) calls it with 1
// before main (tflm_delegate_register.cpp, a static initializer: the C API finds the backend
// when it loads the program), so this file compiles the same for both (one object).
extern "C" int etforge_tflm_register(int state_on_heap) {
  g_state_on_heap = state_on_heap != 0;
  return register_backend(Backend{"EtforgeNpuBackend", &g_backend}) == Error::Ok ? 0 : 1;
}

// etforge's QEMU runner calls this after registering the program's kernels.
extern "C" int etforge_register_delegates(void) { return etforge_tflm_register(0); }
