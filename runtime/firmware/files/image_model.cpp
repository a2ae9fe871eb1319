// The program's part of etforge's QEMU image (runner_image.h): compiled with the program's
// generated etforge_model.h and the image's definitions, so runner.cpp is compiled once and
// linked into every image.
#include "runner_image.h"

#include "etforge_model.h"

#ifndef ETFORGE_MODEL_NS
#define ETFORGE_MODEL_NS etforge_model
#endif
#ifndef ETFORGE_ARENA_SHRINK
#define ETFORGE_ARENA_SHRINK 0  // bytes taken off each arena: a test of the arena check
#endif

namespace {

namespace model = ::ETFORGE_MODEL_NS;
namespace method_info = ::ETFORGE_MODEL_NS::forward;
using etforge_image::kAlign;
using etforge_image::kGuard;
using etforge_image::round_up;

constexpr std::size_t shrunk(std::size_t i) {
  return method_info::kArenaBytes[i] > ETFORGE_ARENA_SHRINK ? method_info::kArenaBytes[i] - ETFORGE_ARENA_SHRINK : 0;
}
constexpr std::size_t arena_total() {
  std::size_t total = 0;
  for (std::size_t i = 0; i < method_info::kNumArenas; ++i) total += round_up(shrunk(i)) + kGuard;
  return total + kAlign;
}

alignas(16) std::uint8_t g_arena[arena_total()];
::executorch::runtime::Span<std::uint8_t> g_planned[method_info::kNumArenas > 0 ? method_info::kNumArenas : 1];

}  // namespace

namespace etforge_image {

const char* const kMethodName = method_info::kName;
const std::size_t kPteSize = model::kPteSize;
const std::size_t kPteAlignment = model::kPteAlignment;
const std::size_t kNumArenas = method_info::kNumArenas;
const std::size_t kArenaShrink = ETFORGE_ARENA_SHRINK;
std::size_t arena_bytes(std::size_t i) { return shrunk(i); }
std::uint8_t* const arena = g_arena;
::executorch::runtime::Span<std::uint8_t>* const planned = g_planned;
::executorch::runtime::Error register_kernels() { return model::register_kernels(); }

}  // namespace etforge_image
