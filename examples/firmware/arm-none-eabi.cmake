# CMake toolchain file for the Arm GNU toolchain (arm-none-eabi-gcc with newlib). The CPU flags
# come from etforge_add_runtime(... CPU cortex-m33), which puts them on every target it links.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_CXX_COMPILER arm-none-eabi-g++)
set(CMAKE_ASM_COMPILER arm-none-eabi-gcc)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
set(CMAKE_C_FLAGS_INIT "-mcpu=cortex-m33 -mthumb -mfloat-abi=hard -mfpu=fpv5-sp-d16")
set(CMAKE_CXX_FLAGS_INIT "-mcpu=cortex-m33 -mthumb -mfloat-abi=hard -mfpu=fpv5-sp-d16")
set(CMAKE_ASM_FLAGS_INIT "-mcpu=cortex-m33 -mthumb -mfloat-abi=hard -mfpu=fpv5-sp-d16")
# Release is -O2, what etforge's own QEMU image uses (CMake would append its -O3 -DNDEBUG to a
# *_FLAGS_RELEASE_INIT): set as cache entries, which CMake's defaults then leave alone.
set(CMAKE_C_FLAGS_RELEASE "-O2" CACHE STRING "C flags for Release builds")
set(CMAKE_CXX_FLAGS_RELEASE "-O2" CACHE STRING "C++ flags for Release builds")
