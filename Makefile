# kvq - one Makefile for the library, the kvq tool, tests, benchmarks and fuzzers.
#
#   make            libkvq.a, libkvq.so, kvq.pc, kvq-uninstalled.pc and the kvq command in $(BUILD)/
#   make test       build and run every test (closes with "N passed, N failed")
#   make run        the main job: the bundled model answers a ~3.5K-token passkey prompt
#                   (builds the CPU library and kvq only: $(BUILD)/cpu/ when CUDA is on)
#   make bench      benchmarks: JSON in $(BUILD)/bench/, a table on stdout
#   make sanitize   the tests under ASan + UBSan (in build-san/)
#   make fuzz       the parsers of untrusted bytes under libFuzzer (FUZZ_SECONDS each)
#   make install PREFIX=/usr/local
#
# Missing Debian packages are installed by mk/deps.sh when run as root;
# otherwise the build stops with the apt-get line to run.
# Several builds may share the tree: BUILD=dir keeps their outputs apart.

BUILD   ?= build
PREFIX  ?= /usr/local
CC      ?= cc
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 30
VERSION := 0.1.0
SOVERSION := 0
NVCC    ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
# CUDA=auto (default): the CUDA parts are built where nvcc >= 12 (the first
# that targets sm_90a) and its static runtime exist; CUDA=0 never (same as
# NVCC=); CUDA=1 requires them. One line says which.
CUDA    ?= auto
KVQ_NVCC_ORIGIN := $(origin NVCC)
ifeq ($(CUDA),0)
override NVCC :=
endif

ifeq ($(CI),true)
WERROR ?= 1
endif

# Include paths draw the module boundaries: the public headers (include/kvq,
# installed as they are) are visible everywhere; the library's internal
# headers only to kvq/ and codebooks/; decoder/, eval/ and tools/ see their
# own folder and the public API. Tests and benchmarks see everything.
MODULES  := common codebook rotation codec cache attn
PUB_INC  := include/kvq
KVQ_INC  := $(PUB_INC) $(addprefix kvq/,$(MODULES)) kvq/cuda codebooks
DEC_INC  := $(PUB_INC) decoder $(patsubst %/,%,$(wildcard decoder/*/))
EVAL_INC := $(PUB_INC) eval
TOOL_INC := $(PUB_INC) tools
INCDIRS  := $(KVQ_INC) $(DEC_INC) eval tools tests
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wvla -Wformat=2 -Wundef
CFLAGS   ?= -O2 -g
ALL_CFLAGS = -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -fPIC $(WARN) \
             $(if $(filter 1,$(WERROR)),-Werror) $(addprefix -I,$(INCDIRS)) $(VIS) $(CUDA_DEFS) -MMD -MP $(CFLAGS)
# -DKVQ_HAVE_CUDA / -DKVQ_HAVE_CUBLAS when the CUDA parts are built (below);
# a variable of its own so that the CPU-only objects of `make run` can drop it.
CUDA_DEFS :=
SIMD_FLAGS := -mavx2 -mfma -mf16c
LDLIBS   := -lfftw3f -lopenblas -lcjson -lpcre2-8 -lutf8proc -lm -lpthread
# EXTRA_LDLIBS: what a build for another machine links in besides
# (bench/device_kit.sh: the BLAS shim's OpenMP runtime)
LDLIBS   += $(EXTRA_LDLIBS)
# What the CPU-only library and command of `make run` link: LDLIBS before
# the CUDA runtime and cuBLAS join it.
CPU_LDLIBS := $(LDLIBS)
# kvq serve's HTTP (tools/serve_http.c): the command links it, the library does not.
APP_LDLIBS := -lmicrohttpd

LIB_SRC   := $(sort $(wildcard kvq/*/*.c) $(wildcard codebooks/*.c) $(wildcard decoder/*.c decoder/*/*.c) \
                   $(wildcard eval/*.c))
TOOL_SRC  := $(sort $(wildcard tools/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
FUZZ_SRC  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
CUDA_SRC  := $(sort $(wildcard kvq/cuda/*.cu))
DEC_CUDA_SRC := $(sort $(wildcard decoder/*/*.cu))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)

# Library objects: their own include paths, and hidden symbols unless a
# public header marks them KVQ_API (kvq_export.h). The same for the CPU-only
# variants of `make run` under $(BUILD)/cpu/obj (CPU_ONLY_SRC below).
OBJ_TREES := $(BUILD)/obj $(BUILD)/cpu/obj
$(foreach t,$(OBJ_TREES),$(t)/kvq/%.o $(t)/codebooks/%.o): INCDIRS := $(KVQ_INC)
$(foreach t,$(OBJ_TREES),$(t)/decoder/%.o): INCDIRS := $(DEC_INC)
$(foreach t,$(OBJ_TREES),$(t)/eval/%.o): INCDIRS := $(EVAL_INC)
$(foreach t,$(OBJ_TREES),$(t)/tools/%.o): INCDIRS := $(TOOL_INC)
$(foreach t,$(OBJ_TREES),$(t)/kvq/%.o $(t)/codebooks/%.o $(t)/decoder/%.o $(t)/eval/%.o): VIS := -fvisibility=hidden
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
FUZZ_BIN  := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)

# CUDA objects join the library whenever nvcc (12 or later) and its static
# runtime exist (see CUDA above); the code checks for a device at run time, so the same build works (and
# skips) without a GPU. nvcc is often a symlink (/usr/local/bin/nvcc), so the
# toolkit root comes from the resolved path, and a toolkit without
# libcudart_static.a builds the CPU-only library rather than failing to link.
ifneq ($(strip $(NVCC)),)
NVCC_MAJOR := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
ifeq ($(shell test "0$(NVCC_MAJOR)" -ge 12 && echo ok),)
KVQ_CUDA_WHY := $(NVCC) is $(if $(NVCC_MAJOR),release $(NVCC_MAJOR),not runnable), sm_90a needs nvcc 12 or later
override NVCC :=
endif
endif
ifneq ($(strip $(NVCC)),)
ifneq ($(strip $(CUDA_SRC)),)
override NVCC := $(or $(realpath $(NVCC)),$(NVCC))
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDART     := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart_static.a \
                $(CUDA_HOME)/targets/*/lib/libcudart_static.a \
                /usr/local/cuda/lib64/libcudart_static.a \
                /usr/lib/x86_64-linux-gnu/libcudart_static.a))
ifneq ($(strip $(CUDART)),)
# NVCC_GENCODE: sm_90a machine code, and PTX for other GPUs; a bundle for
# the H100/H200 machines alone may take the first only (half the size).
NVCC_GENCODE ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=compute_80
NVCC_FLAGS ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC -Xcompiler -fvisibility=hidden \
              $(NVCC_GENCODE) $(addprefix -I,$(INCDIRS))
LIB_OBJ    += $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
BENCH_CUDA_OBJ := $(BUILD)/obj/bench/bench_cuda_util.o
CUDA_DEFS  += -DKVQ_HAVE_CUDA=1
LDLIBS     += $(CUDART) -ldl -lrt -lstdc++
# The decoder's CUDA backend needs cuBLAS (shared: the toolkit ships no
# static cuBLAS here); without it the decoder builds its CPU backend only.
CUBLAS_DIR := $(firstword $(patsubst %/libcublas.so,%,$(wildcard $(CUDA_HOME)/lib64/libcublas.so \
                $(CUDA_HOME)/targets/*/lib/libcublas.so)))
ifneq ($(strip $(CUBLAS_DIR)),)
LIB_OBJ    += $(DEC_CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
CUDA_DEFS  += -DKVQ_HAVE_CUBLAS=1
LDLIBS     += -L$(CUBLAS_DIR) -Wl,-rpath,$(CUBLAS_DIR) -lcublas
endif
KVQ_CUDA_ON := 1
else
KVQ_CUDA_WHY := $(NVCC) found but no libcudart_static.a under $(CUDA_HOME)
endif
endif
endif
ifeq ($(KVQ_CUDA_ON),1)
KVQ_CUDA_LINE := kvq: CUDA on: nvcc $(NVCC_MAJOR).x at $(NVCC), sm_90a$(if $(CUBLAS_DIR),, (no cuBLAS: the decoder runs on the CPU only)) (CUDA=0 builds without)
else ifeq ($(CUDA),1)
$(error kvq: CUDA=1 but $(or $(KVQ_CUDA_WHY),no nvcc found))
else
KVQ_CUDA_LINE := kvq: CUDA off: $(or $(KVQ_CUDA_WHY),$(if $(filter 0,$(CUDA)),CUDA=0,$(if $(filter command line,$(KVQ_NVCC_ORIGIN)),NVCC= given,no nvcc found))); CPU-only build
endif
$(info $(KVQ_CUDA_LINE))

# `make run` (the main job, a demo on the CPU) needs the CPU library and the
# kvq command only, and should not wait for nvcc: on 2 cores the .cu files
# take about 4.5 of the 5 minutes a fresh clone's full build takes. With
# CUDA on, those two are $(BUILD)/cpu/lib/libkvq.a and $(BUILD)/cpu/bin/kvq,
# made of the C objects of $(BUILD)/obj (shared with `make`: their code does
# not depend on -DKVQ_HAVE_CUDA/-DKVQ_HAVE_CUBLAS) plus, compiled again
# without the defines under $(BUILD)/cpu/obj, the sources that read them
# (CPU_ONLY_SRC: today the two stubs); no .cu object. Without CUDA they are
# the build's own library and command.
ifeq ($(KVQ_CUDA_ON),1)
CPU_BUILD := $(BUILD)/cpu
# Found by grep, so that a new #ifdef cannot make the shared objects wrong;
# a header that reads the defines changes whatever includes it, and then
# every library and tool source is compiled again.
KVQ_HAVE_RE  := KVQ_HAVE_CU(DA|BLAS)
KVQ_HAVE_HDR := $(shell grep -rlE '$(KVQ_HAVE_RE)' include kvq decoder codebooks eval tools --include='*.h' 2>/dev/null)
CPU_ONLY_SRC := $(if $(KVQ_HAVE_HDR),$(LIB_SRC) $(TOOL_SRC),$(shell grep -lE '$(KVQ_HAVE_RE)' $(LIB_SRC) $(TOOL_SRC) 2>/dev/null))
cpu_objs = $(foreach s,$(1),$(if $(filter $(s),$(CPU_ONLY_SRC)),$(CPU_BUILD)/obj,$(BUILD)/obj)/$(s:.c=.o))
CPU_LIB_OBJ  := $(call cpu_objs,$(LIB_SRC))
CPU_TOOL_OBJ := $(call cpu_objs,$(TOOL_SRC))
CPU_LIB_A    := $(CPU_BUILD)/lib/libkvq.a
KVQ_CPU      := $(CPU_BUILD)/bin/kvq
ifneq ($(filter run,$(MAKECMDGOALS)),)
$(info kvq: make run builds the CPU library and command only, in $(CPU_BUILD)/ (make builds the CUDA parts))
endif
else
CPU_BUILD := $(BUILD)
CPU_LIB_A := $(LIB_A)
KVQ_CPU   := $(KVQ)
endif

LIB_A  := $(BUILD)/lib/libkvq.a
LIB_SO := $(BUILD)/lib/libkvq.so
# libkvq.so -> libkvq.so.0 (the SONAME programs record) -> libkvq.so.0.1.0
LIB_SO_REAL := $(LIB_SO).$(VERSION)
KVQ    := $(BUILD)/bin/kvq
PC     := $(BUILD)/lib/pkgconfig/kvq.pc
# The build tree's own .pc (pkg-config's -uninstalled convention): found
# with PKG_CONFIG_PATH=$(BUILD)/lib, it points at $(BUILD)/lib and include/.
PC_UNINSTALLED := $(BUILD)/lib/kvq-uninstalled.pc
DEPS_OK := $(BUILD)/.deps-ok

.PHONY: all test bench sanitize fuzz run install clean deps tests benches
# Keep intermediate objects (test and bench .o files): no rebuilds, and no
# "rm ..." line from make after the suite's closing "N passed, N failed".
.SECONDARY:
all: $(LIB_A) $(LIB_SO) $(PC) $(PC_UNINSTALLED) $(KVQ)

deps: $(DEPS_OK)
$(DEPS_OK): mk/deps.sh
	@sh mk/deps.sh
	@mkdir -p $(@D) && touch $@

# The C rules of each object tree: $(BUILD)/obj, and $(BUILD)/cpu/obj for
# the CPU-only variants of `make run` (without CUDA_DEFS).
define c_rules
$(1)/%_avx2.o: %_avx2.c | $$(DEPS_OK)
	@mkdir -p $$(@D)
	$$(CC) $$(ALL_CFLAGS) $$(SIMD_FLAGS) -c $$< -o $$@

$(1)/%.o: %.c | $$(DEPS_OK)
	@mkdir -p $$(@D)
	$$(CC) $$(ALL_CFLAGS) -c $$< -o $$@
endef
$(foreach t,$(OBJ_TREES),$(eval $(call c_rules,$(t))))
$(BUILD)/cpu/obj/%.o: CUDA_DEFS :=

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(LIB_SO_REAL): $(LIB_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,libkvq.so.$(SOVERSION) -Wl,--exclude-libs,ALL -o $@ $^ $(LDFLAGS) $(LDLIBS)
$(LIB_SO): $(LIB_SO_REAL)
	ln -sf libkvq.so.$(VERSION) $(@D)/libkvq.so.$(SOVERSION) && ln -sf libkvq.so.$(SOVERSION) $@

$(PC): mk/kvq.pc.in Makefile
	@mkdir -p $(@D)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS@|$(LDLIBS)|' $< > $@

# Absolute paths: the .pc is read from wherever the program is built.
$(PC_UNINSTALLED): mk/kvq-uninstalled.pc.in Makefile
	@mkdir -p $(@D)
	sed -e 's|@SRCDIR@|$(CURDIR)|' -e 's|@LIBDIR@|$(abspath $(BUILD))/lib|' -e 's|@VERSION@|$(VERSION)|' \
	    -e 's|@LIBS@|$(LDLIBS)|' $< > $@

$(KVQ): $(TOOL_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(TOOL_OBJ) $(LIB_A) $(LDLIBS) $(APP_LDLIBS)

ifeq ($(KVQ_CUDA_ON),1)
$(CPU_LIB_A): $(CPU_LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(KVQ_CPU): $(CPU_TOOL_OBJ) $(CPU_LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(CPU_TOOL_OBJ) $(CPU_LIB_A) $(CPU_LDLIBS) $(APP_LDLIBS)
endif

# Tests link the tool objects too (except main), so subcommands are testable.
TOOL_LIB_OBJ := $(filter-out $(BUILD)/obj/tools/kvq.o,$(TOOL_OBJ))
$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TOOL_LIB_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $< $(TOOL_LIB_OBJ) $(LIB_A) $(LDLIBS) $(APP_LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB_A) $(LDLIBS)
# The benchmarks' GPU helpers (timer, fill, plain read) are bench-only code,
# linked into bench_cuda and bench_prefill_cuda when nvcc builds them; without
# nvcc their header stubs.
$(BUILD)/bench/bench_cuda $(BUILD)/bench/bench_prefill_cuda $(BUILD)/bench/bench_decoder_cuda: $(BENCH_CUDA_OBJ)

tests: $(TEST_BIN) $(KVQ) $(LIB_SO) $(PC_UNINSTALLED)
test: tests
	@sh tests/tokenizer/fetch.sh build/tokenizer-data
	@KVQ_BUILD=$(BUILD) sh tests/run.sh $(BUILD) $(TEST_BIN) tests/test_boundaries.sh tests/cuda/test_emulate_v4.sh \
	    tests/test_serve.sh tests/test_serve_http.sh tests/test_serve_chaos.sh tests/test_cli.sh tests/test_readme.sh tests/test_example.sh tests/test_doc_links.sh tests/test_python.sh

benches: $(BENCH_BIN) $(KVQ)
bench: benches
	@sh bench/run.sh $(BUILD) $(BENCH_BIN)

sanitize:
	$(MAKE) BUILD=build-san CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	        LDFLAGS="-fsanitize=address,undefined" NVCC= test

# libFuzzer targets: clang, no CUDA, each run for FUZZ_SECONDS on its corpus.
fuzz:
	@FUZZ_CC=$(FUZZ_CC) sh mk/deps.sh fuzz
	$(MAKE) BUILD=build-fuzz CC=$(FUZZ_CC) NVCC= CFLAGS="-O1 -g -fsanitize=fuzzer-no-link,address,undefined" fuzzers
	@sh tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)
fuzzers: $(FUZZ_BIN)
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -fsanitize=fuzzer,address,undefined -o $@ $(filter %.o,$^) $(LIB_A) $(LDLIBS)
# kvq serve's request parser lives with the command (tools/).
$(BUILD)/fuzz/fuzz_serve_request: $(BUILD)/obj/tools/serve_request.o $(BUILD)/obj/tools/serve_json.o
$(BUILD)/fuzz/fuzz_serve_http: $(BUILD)/obj/tools/serve_route.o $(BUILD)/obj/tools/serve_tokenize.o \
    $(BUILD)/obj/tools/serve_request.o $(BUILD)/obj/tools/serve_json.o

run: $(KVQ_CPU)
	@sh mk/run-demo.sh $(CPU_BUILD)

install: all
	install -d $(DESTDIR)$(PREFIX)/include/kvq $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(wildcard include/kvq/*.h include/kvq/*.cuh) $(DESTDIR)$(PREFIX)/include/kvq/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO_REAL) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libkvq.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libkvq.so.$(SOVERSION)
	ln -sf libkvq.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/libkvq.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS@|$(LDLIBS)|' mk/kvq.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvq.pc
	install -m 755 $(KVQ) $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf $(BUILD) build-san build-fuzz

-include $(shell find $(OBJ_TREES) -name '*.d' 2>/dev/null)
