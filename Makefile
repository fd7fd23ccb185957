# kvcache - attention with a KV cache.
#
#   make            the library (build/libkvcache.{a,so}) and the `kvcache` command
#   make test       build and run every test (C suite, examples, Python binding)
#   make test-asan  the C suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-portable  the C suite built without -march=native, with the SIMD kernels and forced scalar
#   make run        build, fetch the default model if missing, run the main job
#   make bench      the attention benchmark against this machine's limits
#   make install PREFIX=/usr/local, make uninstall
#   make test-install   install into a temp prefix, build readme_decode.c against it via pkg-config
#   make install-python pip install ./python (the ctypes binding, shipping build/libkvcache.so)
#
# Variables: BUILD (output folder), CC, OPT, MARCH (empty for a portable build).

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
MARCH   ?= -march=native
PREFIX  ?= /usr/local
PYTHON  ?= python3

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) $(MARCH) -g $(WARN) -fPIC -Iinclude $(CFLAGS)
LDLIBS_ALL := -lpthread -lm

LIB_SRC    := $(wildcard src/*.c)
ENGINE_SRC := $(wildcard engine/*.c)
CLI_SRC    := $(wildcard cli/*.c)
TEST_SRC   := $(wildcard tests/*.c)

LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/%.o)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ   := $(TEST_SRC:%.c=$(BUILD)/%.o)

# SIMD variants are compiled for their instruction set whatever MARCH says and
# picked at run time by CPU feature (src/attend.c).
$(BUILD)/src/%_avx2.o:   CFLAGS_ALL += -mavx2 -mfma -mf16c
$(BUILD)/src/%_avx512.o: CFLAGS_ALL += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c
$(BUILD)/engine/%_avx2.o:   CFLAGS_ALL += -mavx2 -mfma -mf16c
$(BUILD)/engine/%_avx512.o: CFLAGS_ALL += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c
# The int8-activation kernels promise the scalar reference's bits: no mul+add
# may be fused into an FMA behind their back (clang fuses by default).
$(BUILD)/engine/quant%.o: CFLAGS_ALL += -ffp-contract=off
$(BUILD)/engine/quant_avx512.o: engine/quant_avx2.c engine/quant_act_avx2.c

.PHONY: all lib test test-c test-asan test-portable run bench model install uninstall clean fuzz examples \
        test-install install-python

all: lib $(BUILD)/kvcache
lib: $(BUILD)/libkvcache.a $(BUILD)/libkvcache.so

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h engine/*.h cli/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/libkvcache.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libkvcache.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS_ALL)

$(BUILD)/libkvengine.a: $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/kvcache: $(CLI_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a $(LDFLAGS) $(LDLIBS_ALL)

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a
	$(CC) $(CFLAGS_ALL) -o $@ $(TEST_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a $(LDFLAGS) $(LDLIBS_ALL)

# ---------------------------------------------------------------- tests
test-c: $(BUILD)/run_tests $(BUILD)/kvcache
	KVCACHE_BIN=$(BUILD)/kvcache $(BUILD)/run_tests

test: test-c examples test-install
	@if [ -d python/tests ] && $(PYTHON) -c 'import numpy, pytest' 2>/dev/null; then \
	    KVCACHE_LIB=$(abspath $(BUILD))/libkvcache.so PYTHONPATH=python $(PYTHON) -m pytest -q python/tests; \
	elif [ -d python/tests ]; then echo "python tests need numpy and pytest (pip install numpy pytest)"; exit 1; fi

test-asan:
	$(MAKE) BUILD=build-asan OPT=-O1 CC=clang \
	    CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined" test-c

# A portable build still runs the SIMD kernels (chosen by CPUID); the second
# run forces the scalar ones everywhere (library and engine) through KVCACHE_SIMD.
test-portable:
	$(MAKE) BUILD=build-portable MARCH= test-c
	KVCACHE_SIMD=scalar $(MAKE) BUILD=build-portable MARCH= test-c

# ---------------------------------------------------------------- examples
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
$(BUILD)/examples/%: examples/%.c $(BUILD)/libkvcache.a include/kvcache.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libkvcache.a $(LDLIBS_ALL)
PY_EXAMPLES := $(wildcard examples/*.py)
examples: $(EXAMPLES) $(BUILD)/libkvcache.so
	@sh scripts/check-readme.sh $(BUILD)
	@for e in $(EXAMPLES); do echo "== $$e"; $$e > /dev/null || exit 1; done
	@if [ -n "$(PY_EXAMPLES)" ] && ! $(PYTHON) -c 'import numpy' 2>/dev/null; then \
	    echo "the Python examples need numpy (pip install numpy)"; exit 1; fi
	@for e in $(PY_EXAMPLES); do echo "== $$e"; \
	    KVCACHE_LIB=$(abspath $(BUILD))/libkvcache.so PYTHONPATH=python $(PYTHON) $$e > /dev/null || exit 1; done

# ---------------------------------------------------------------- running
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
model: $(MODEL)
$(MODEL):
	sh scripts/fetch-model.sh $(MODEL)

# The main job: a chat-formatted prompt answered by the default model, greedy,
# streamed; speed and KV bytes on stderr. `kvcache demo` is the synthetic loop.
PROMPT ?= Explain in three sentences why a language model keeps a cache of keys and values.
run: all $(MODEL)
	$(BUILD)/kvcache generate -m $(MODEL) --chat -p "$(PROMPT)" -n 200 --temp 0

bench: all
	$(BUILD)/kvcache bench attention

# ---------------------------------------------------------------- install
# PREFIX/include/kvcache.h, PREFIX/lib/libkvcache.{a,so}, PREFIX/lib/pkgconfig/kvcache.pc,
# PREFIX/bin/kvcache, PREFIX/share/man/man1/kvcache.1; DESTDIR stages them elsewhere.
VERSION ?= 0.1.0
INSTALLED := include/kvcache.h lib/libkvcache.a lib/libkvcache.so lib/pkgconfig/kvcache.pc \
             bin/kvcache share/man/man1/kvcache.1
install: all
	install -d $(addprefix $(DESTDIR)$(PREFIX)/,include lib/pkgconfig bin share/man/man1)
	install -m 644 include/kvcache.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libkvcache.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libkvcache.so $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/kvcache $(DESTDIR)$(PREFIX)/bin/
	install -m 644 docs/kvcache.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	sed -e 's|@PREFIX@|$(abspath $(PREFIX))|' -e 's|@VERSION@|$(VERSION)|' kvcache.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvcache.pc
	chmod 644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvcache.pc

uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALLED))

# Installs into a temporary prefix, compiles examples/readme_decode.c against it
# with pkg-config's flags, shared (run with LD_LIBRARY_PATH) and static, runs
# both, and checks that uninstall leaves no file behind.
test-install: all
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(MAKE) --no-print-directory -s install PREFIX=$$tmp/usr > /dev/null; \
	export PKG_CONFIG_PATH=$$tmp/usr/lib/pkgconfig; \
	flags=$$(pkg-config --cflags --libs kvcache); \
	echo "test-install: pkg-config --cflags --libs kvcache: $$flags"; \
	$(CC) -std=c11 -o $$tmp/shared examples/readme_decode.c $$flags; \
	LD_LIBRARY_PATH=$$tmp/usr/lib ldd $$tmp/shared | grep -q "$$tmp/usr/lib/libkvcache.so"; \
	out=$$(LD_LIBRARY_PATH=$$tmp/usr/lib $$tmp/shared); echo "test-install: shared: $$out"; \
	$(CC) -std=c11 -o $$tmp/static examples/readme_decode.c $$(pkg-config --cflags kvcache) \
	    $$(pkg-config --static --libs kvcache | sed 's/-lkvcache/-l:libkvcache.a/'); \
	if ldd $$tmp/static | grep -q libkvcache; then echo "test-install: static build loads libkvcache.so"; exit 1; fi; \
	out=$$($$tmp/static); echo "test-install: static: $$out"; \
	$$tmp/usr/bin/kvcache --help > /dev/null; \
	$(MAKE) --no-print-directory -s uninstall PREFIX=$$tmp/usr; \
	left=$$(find $$tmp/usr -type f); \
	if [ -n "$$left" ]; then echo "test-install: uninstall left $$left"; exit 1; fi; \
	echo "test-install: install, pkg-config, shared and static builds, uninstall: ok"

# The Python package into the current environment (see python/README.md).
install-python: lib
	KVCACHE_LIB=$(abspath $(BUILD))/libkvcache.so $(PYTHON) -m pip install ./python

# ---------------------------------------------------------------- fuzzing
# Every tests/fuzz/fuzz_NAME.c is a libFuzzer target, seeded from
# tests/fuzz/corpus_NAME when present, run for FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang OPT=-O1 \
	    CFLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
	    build-fuzz/libkvengine.a build-fuzz/libkvcache.a
	@for src in tests/fuzz/fuzz_*.c; do \
	    name=$$(basename $$src .c); seeds=tests/fuzz/corpus_$${name#fuzz_}; \
	    clang -g -O1 -march=native -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	        -Iinclude -Iengine $$src build-fuzz/libkvengine.a build-fuzz/libkvcache.a -lm -lpthread \
	        -o build-fuzz/$$name || exit 1; \
	    mkdir -p build-fuzz/corpus_$$name; \
	    echo "== $$name: $(FUZZ_SECONDS) s"; \
	    build-fuzz/$$name -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus_$$name \
	        $$( [ -d $$seeds ] && echo $$seeds ) > build-fuzz/$$name.log 2>&1; rc=$$?; \
	    tail -2 build-fuzz/$$name.log; \
	    if [ $$rc -ne 0 ]; then cat build-fuzz/$$name.log | tail -40; echo "== $$name FAILED"; exit 1; fi; \
	done

clean:
	rm -rf build build-asan build-portable build-fuzz
