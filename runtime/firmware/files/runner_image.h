// What etforge's QEMU runner (runner.cpp, the same object in every image) needs of the program:
// defined by image_model.cpp, the one source of an image compiled with its etforge_model.h.
#pragma once

#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/span.h>

#include <cstddef>
#include <cstdint>

namespace etforge_image {

// Layout of the planned buffers in the arena: each rounded up to kAlign, kGuard guard bytes after it.
constexpr std::size_t kAlign = 16;
constexpr std::size_t kGuard = 64;
constexpr std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

extern const char* const kMethodName;  // the method the runner runs ("forward")
extern const std::size_t kPteSize;  // the .pte the header was generated from
extern const std::size_t kPteAlignment;
extern const std::size_t kNumArenas;  // planned memory ids
extern const std::size_t kArenaShrink;  // ETFORGE_ARENA_SHRINK: a test of the arena check
// The image's arena for memory id i + 1 (the header's kArenaBytes less kArenaShrink), in bytes.
std::size_t arena_bytes(std::size_t i);
// Static storage for every planned buffer and its guard bytes, and the spans into it.
extern std::uint8_t* const arena;
extern ::executorch::runtime::Span<std::uint8_t>* const planned;
// The program's generated kernel registration.
::executorch::runtime::Error register_kernels();

}  // namespace etforge_image
