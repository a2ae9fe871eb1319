# TensorFlow Lite Micro for the etforge firmware image (Cortex-M33, DSP, FPv5-SP hard float):
# the interpreter and every integer CMSIS-NN source of the image's one CMSIS-NN tree, then the
# kernels of the ops a program's partitions use. Driven by etforge.runtime.firmware.tflm / build.py:
#   make -f tflm.mk T=<tflite-micro> D=<tflm-deps> NN=<cmsis-nn> B=<dir> CORE="..." NNSRC="..." lib
#   make -f tflm.mk ... B=<dir> KSRC="<kernel sources>" kernels
# The delegate (tflm_delegate.cpp) is compiled with the image (firmware.mk EXTRA_SRC), with
# TFLM_CXXFLAGS' defines and includes (tflm.py passes them).
# Flags as TFLM's own Makefile sets them for cortex_m_generic + cmsis_nn (core -Os, kernels -O2).
# FlatBuffers: TFLM's patched headers, their namespace renamed so they share no symbol with
# the FlatBuffers ExecuTorch's program loader was generated for.
.DELETE_ON_ERROR:
HERE := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
T  ?= $(error T: the TensorFlow Lite Micro source directory)
D  ?= $(error D: the TFLM dependencies directory)
NN ?= $(error NN: the CMSIS-NN source directory)
B  ?= $(error B: the TFLM library build directory)
CXX := arm-none-eabi-g++
CC  := arm-none-eabi-gcc
AR  := arm-none-eabi-ar
CPU := -mcpu=cortex-m33 -mthumb -mfloat-abi=hard -mfpu=fpv5-sp-d16
DEFS := -DTF_LITE_STATIC_MEMORY -DTF_LITE_DISABLE_X86_NEON -DCMSIS_NN -DKERNELS_OPTIMIZED_FOR_SPEED -DNDEBUG \
  -DTF_LITE_MCU_DEBUG_LOG -DCPU_M33=1 -DCMSIS_DEVICE_ARM_CORTEX_M_XX_HEADER_FILE=\"ARMCM33.h\" -DARMCM33 \
  -DARM_NN_ENABLE_F16=0 -DARM_NN_ENABLE_F32=0 -Dflatbuffers=etforge_tflm_flatbuffers
INCS := -I$(T) -I$(D)/flatbuffers/include -I$(D)/gemmlowp -I$(D)/ruy -I$(D)/cmsis/Cortex_DFP/Device/ARMCM33/Include \
  -I$(D)/cmsis/CMSIS/Core/Include -I$(NN) -I$(NN)/Include -I$(HERE)tflm_shim
COMMON := $(CPU) -fno-unwind-tables -fno-asynchronous-unwind-tables -ffunction-sections -fdata-sections \
  -fmessage-length=0 -fomit-frame-pointer -funsigned-char $(DEFS)
TFLM_CXXFLAGS := $(COMMON) -std=c++17 -fno-rtti -fno-exceptions -fno-threadsafe-statics -Wno-psabi $(INCS)
NN_CFLAGS := $(CPU) -O2 -ffunction-sections -fdata-sections -DARM_NN_ENABLE_F16=0 -DARM_NN_ENABLE_F32=0 -I$(NN)/Include

CORE ?=
KSRC ?=
NNSRC ?=
KOBJS := $(addprefix $(B)/kern/,$(KSRC:.cc=.o))
lib: $(B)/libtflm.a $(B)/libcmsis_nn_int.a
# the kernels of the ops a program's partitions use, compiled once into B and reused
kernels: $(KOBJS)
$(B)/core/%.o: $(T)/%.cc
	@mkdir -p $(dir $@); $(CXX) $(TFLM_CXXFLAGS) -Os -c $< -o $@
$(B)/kern/%.o: $(T)/%.cc
	@mkdir -p $(dir $@); $(CXX) $(TFLM_CXXFLAGS) -O2 -c $< -o $@
$(B)/nn/%.o: $(NN)/%.c
	@mkdir -p $(dir $@); $(CC) $(NN_CFLAGS) -c $< -o $@
$(B)/libtflm.a: $(addprefix $(B)/core/,$(CORE:.cc=.o))
	@rm -f $@; $(AR) rcs $@ $^
$(B)/libcmsis_nn_int.a: $(addprefix $(B)/nn/,$(NNSRC:.c=.o))
	@rm -f $@; $(AR) rcs $@ $^

flags:
	@echo $(DEFS) $(INCS)
.PHONY: lib kernels flags
