# etforge firmware build for QEMU mps2-an505 (Cortex-M33 with DSP, FPv5-SP hard float).
# Driven by etforge.runtime.firmware.build, which passes every variable below; run by hand with
#   make -f firmware.mk B=<lib dir> INC=<include root> ET=<executorch src> NN=<cmsis-nn src> UTIL=<...> NNSRC=<...> libs
#   make -f firmware.mk B=... IMG=<image dir> GEN=<OUT/codegen> KERNELS="<kernel sources>" image
# Two stages: `libs` (runtime core, prim ops, portable util, cortex_m ops + CMSIS-NN: the same
# for every model) and `image` (the program's kernels, compiled once into B and reused by
# other models, its generated registration, the runner, linked).
.DELETE_ON_ERROR:
HERE := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
ET   ?= $(error ET: the ExecuTorch source directory)
NN   ?= $(error NN: the CMSIS-NN source directory)
INC  ?= $(error INC: the include root, holding executorch/ and flatbuffers/)
B    ?= $(error B: the library build directory)
CC   := arm-none-eabi-gcc
CXX  := arm-none-eabi-g++
AR   := arm-none-eabi-ar
CPU  := -mcpu=cortex-m33 -mthumb -mfloat-abi=hard -mfpu=fpv5-sp-d16
OPT  ?= -O2
DEFS := -DC10_USING_CUSTOM_GENERATED_MACROS -DET_LOG_ENABLED=1 -DET_EVENT_TRACER_ENABLED -DFLATBUFFERS_MAX_ALIGNMENT=1024 \
        -DARM_NN_ENABLE_F32=0 -DARM_NN_ENABLE_F16=0
INCS := -I$(INC) -I$(ET)/runtime/core/portable_type/c10 -I$(NN)/Include
CXXFLAGS := $(CPU) $(OPT) -ffunction-sections -fdata-sections $(DEFS) $(INCS) -std=gnu++17 \
            -fno-exceptions -fno-rtti -fno-unwind-tables -Wno-psabi -Wno-deprecated-declarations
CFLAGS   := $(CPU) $(OPT) -ffunction-sections -fdata-sections $(DEFS) -I$(NN)/Include

# ExecuTorch's runtime: program loading, method execution, operator registry, platform layer.
CORE := runtime/backend/interface.cpp runtime/core/device_allocator.cpp \
  runtime/core/device_memory_buffer.cpp runtime/core/evalue.cpp \
  runtime/core/exec_aten/util/tensor_shape_to_c_string.cpp \
  runtime/core/exec_aten/util/tensor_util_portable.cpp runtime/core/portable_type/tensor_impl.cpp \
  runtime/core/tag.cpp runtime/core/tensor_layout.cpp runtime/executor/tensor_parser_portable.cpp \
  runtime/executor/tensor_parser_exec_aten.cpp runtime/executor/pte_data_map.cpp \
  runtime/executor/method.cpp runtime/executor/method_meta.cpp runtime/executor/program.cpp \
  runtime/executor/program_validation.cpp runtime/kernel/operator_registry.cpp \
  runtime/platform/abort.cpp runtime/platform/log.cpp runtime/platform/platform.cpp \
  runtime/platform/profiler.cpp runtime/platform/runtime.cpp schema/extended_header.cpp
# Registered by static initializers: linked whole.
PRIM := kernels/prim_ops/et_copy_index.cpp kernels/prim_ops/et_view.cpp kernels/prim_ops/register_prim_ops.cpp
rel = $(sort $(patsubst $(ET)/%,%,$(wildcard $(ET)/$(1))))
# The portable utilities the cortex_m ops include (etforge passes them: sources.util_closure);
# a program's portable kernels bring theirs with KERNELS.
UTIL ?=
CM   := $(call rel,backends/cortex_m/ops/op_*.cpp)
# CMSIS-NN: the int8 paths the cortex_m ops call and their support functions (etforge passes
# them, relative to NN: sources.cmsis_nn_sources).
NNSRC ?=
APP  := startup.c pal_semihost.cpp

o = $(addprefix $(B)/obj/,$(addsuffix .o,$(basename $(1))))
LIBS := $(B)/libet_core.a $(B)/libet_prim_ops.a $(B)/libportable_util.a $(B)/libcortex_m_ops.a \
        $(B)/libcmsis_nn.a $(B)/libetforge_app.a
libs: $(LIBS)
$(B)/obj/%.o: $(ET)/%.cpp
	@mkdir -p $(dir $@); $(CXX) $(CXXFLAGS) -c $< -o $@
$(B)/nn/%.o: $(NN)/%.c
	@mkdir -p $(dir $@); $(CC) $(CFLAGS) -c $< -o $@
$(B)/app/%.o: $(HERE)%.cpp
	@mkdir -p $(dir $@); $(CXX) $(CXXFLAGS) -c $< -o $@
$(B)/app/%.o: $(HERE)%.c
	@mkdir -p $(dir $@); $(CC) $(CFLAGS) -c $< -o $@
$(B)/libet_core.a: $(call o,$(CORE))
$(B)/libet_prim_ops.a: $(call o,$(PRIM))
$(B)/libportable_util.a: $(call o,$(UTIL))
$(B)/libcortex_m_ops.a: $(call o,$(CM))
$(B)/libcmsis_nn.a: $(patsubst %.c,$(B)/nn/%.o,$(NNSRC))
$(B)/libetforge_app.a: $(addprefix $(B)/app/,$(addsuffix .o,$(basename $(APP))))
$(B)/%.a:
	@rm -f $@; $(AR) rcs $@ $^

# -- per model ------------------------------------------------------------------------------
IMG  ?= $(B)/no-image
GEN  ?= $(B)/no-gen
REG  ?= etforge_model_kernels.cpp
KERNELS ?=
IMG_DEFS ?=
KOBJS := $(call o,$(KERNELS))
# A delegate backend's sources (EXTRA_CXXFLAGS first: its include paths win, e.g. TFLM's
# FlatBuffers over ExecuTorch's; -I$(IMG) for generated headers)
# and the libraries they need (build.py passes them: the TFLM partitions' backend).
EXTRA_SRC ?=
EXTRA_CXXFLAGS ?=
EXTRA_LIBS ?=
XOBJS := $(addprefix $(IMG)/extra/,$(notdir $(EXTRA_SRC:.cpp=.o)))
vpath %.cpp $(sort $(dir $(EXTRA_SRC)))
$(IMG)/extra/%.o: %.cpp
	@mkdir -p $(dir $@); $(CXX) $(EXTRA_CXXFLAGS) $(CXXFLAGS) -I$(GEN) -I$(IMG) $(IMG_DEFS) -c $< -o $@
image: $(IMG)/runner.elf
$(IMG)/registration.o: $(GEN)/$(REG)
	@mkdir -p $(dir $@); $(CXX) $(CXXFLAGS) -I$(GEN) $(IMG_DEFS) -c $< -o $@
$(IMG)/runner.o: $(HERE)runner.cpp $(GEN)/etforge_model.h
	@mkdir -p $(dir $@); $(CXX) $(CXXFLAGS) -I$(GEN) $(IMG_DEFS) -c $< -o $@
$(IMG)/runner.elf: $(IMG)/registration.o $(IMG)/runner.o $(KOBJS) $(XOBJS) $(LIBS) $(HERE)an505.ld
	$(CXX) $(CPU) --specs=rdimon.specs -nostartfiles -T $(HERE)an505.ld -Wl,--gc-sections \
	  -Wl,-Map=$(IMG)/runner.map -Wl,--undefined=Reset_Handler \
	  $(IMG)/runner.o $(IMG)/registration.o $(KOBJS) $(XOBJS) \
	  -Wl,--whole-archive $(B)/libet_prim_ops.a $(B)/libetforge_app.a -Wl,--no-whole-archive \
	  -Wl,--start-group $(B)/libcortex_m_ops.a $(EXTRA_LIBS) $(B)/libcmsis_nn.a $(B)/libportable_util.a \
	  $(B)/libet_core.a -Wl,--end-group -o $@.tmp && mv $@.tmp $@
.PHONY: libs image
