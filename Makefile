# kvcache - attention with a KV cache.
#
#   make            the library (build/libkvcache.{a,so}) and the `kvcache` command
#   make test       build and run every test (C suite, examples, Python binding)
#   make test-asan  the C suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-portable  the C suite built without -march=native (scalar paths)
#   make run        build, fetch the default model if missing, run the main job
#   make bench      the attention benchmark against this machine's limits
#   make install PREFIX=/usr/local, make uninstall
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

.PHONY: all lib test test-c test-asan test-portable run bench model install uninstall clean fuzz examples

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
	$(BUILD)/run_tests

test: test-c examples
	@if [ -d python/tests ] && $(PYTHON) -c 'import numpy, pytest' 2>/dev/null; then \
	    KVCACHE_LIB=$(abspath $(BUILD))/libkvcache.so PYTHONPATH=python $(PYTHON) -m pytest -q python/tests; \
	elif [ -d python/tests ]; then echo "python tests need numpy and pytest (pip install numpy pytest)"; exit 1; fi

test-asan:
	$(MAKE) BUILD=build-asan OPT=-O1 CC=clang \
	    CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined" test-c

test-portable:
	$(MAKE) BUILD=build-portable MARCH= test-c

# ---------------------------------------------------------------- examples
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
$(BUILD)/examples/%: examples/%.c $(BUILD)/libkvcache.a include/kvcache.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libkvcache.a $(LDLIBS_ALL)
examples: $(EXAMPLES)
	@sh scripts/check-readme.sh $(BUILD)
	@for e in $(EXAMPLES); do echo "== $$e"; $$e > /dev/null || exit 1; done

# ---------------------------------------------------------------- running
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
model: $(MODEL)
$(MODEL):
	sh scripts/fetch-model.sh $(MODEL)

run: all
	$(BUILD)/kvcache demo

bench: all
	$(BUILD)/kvcache bench attention

# ---------------------------------------------------------------- install
install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/kvcache.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libkvcache.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libkvcache.so $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/kvcache $(DESTDIR)$(PREFIX)/bin/
	sed 's|@PREFIX@|$(PREFIX)|' kvcache.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvcache.pc

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/kvcache.h $(DESTDIR)$(PREFIX)/lib/libkvcache.a \
	      $(DESTDIR)$(PREFIX)/lib/libkvcache.so $(DESTDIR)$(PREFIX)/bin/kvcache \
	      $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvcache.pc

clean:
	rm -rf build build-asan build-portable
