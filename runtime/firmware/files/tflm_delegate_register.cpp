// etforge's CPU stand-in for NPU partitions (tflm_delegate.cpp), registered before main for a
// firmware of the CMake package (etforge_tflm_libraries ... SELF_REGISTER): its C API finds the
// backend when it loads the program, and the stand-in keeps its state on the heap (the C API
// sizes the method pool for ExecuTorch alone). etforge's QEMU runner does not link this file.
extern "C" int etforge_tflm_register(int state_on_heap);

namespace {
const bool g_registered = etforge_tflm_register(1) == 0;
}  // namespace
