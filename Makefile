# kvcache - attention with a KV cache.
#
#   make            the library (build/libkvcache.{a,so}) and the `kvcache` command
#   make test       build and run every test (C suite, examples, Python binding, HTTP server);
#                   first installs the Debian packages it needs (scripts/deps.sh) and the
#                   Python ones into build/venv (python/requirements-test.txt)
#   make test-server  kvcache serve through the openai client and curl (tests/server)
#   make test-cli   kvcache chat on a pseudo-terminal (tests/cli)
#   make test-threads  the Python thread tests and the C concurrent-call tests under
#                   ThreadSanitizer
#   make test-asan  the C suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-server-asan  part of tests/server against kvcache built with both sanitizers
#   make test-portable  the C suite built without -march=native, with the SIMD kernels and forced scalar
#   make run        build, fetch the default model if missing, answer one prompt (generate --chat)
#   make bench      the attention benchmark against this machine's limits
#   make install PREFIX=/usr/local, make uninstall
#   make test-install   install into a temp prefix, build readme_decode.c (kvcache) and
#                   readme_generate.c (kvengine) against it via pkg-config
#   make install-python pip install ./python (the ctypes binding, shipping portable builds of
#                   libkvcache.so and libkvengine.so from build-portable/)
#
# Variables: BUILD (output folder), CC, OPT, MARCH (empty for a portable build),
# PYTHON (makes the venv), TEST_PYTHON (runs the Python tests: build/venv's, or
# any interpreter that has numpy and pytest, which then skips the venv),
# TEST_JOBS (processes sharing the C suite, 2 by default: most tests use one
# core, and the sanitizer runs take minutes; 1 prints a failure's lines in order).

.DEFAULT_GOAL := all

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
MARCH   ?= -march=native
PREFIX  ?= /usr/local
PYTHON  ?= python3
VENV    ?= build/venv
MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
# The tests' second model (Gemma 3 270M: sliding windows, two cache groups,
# SentencePiece; synth_model.py copies its tokenizer), fetched before any
# suite that reads it, so that no suite depends on another having fetched it
GEMMA_MODEL := models/gemma-3-270m-Q4_K_M.gguf
# The release: `kvcache --version`, the pkg-config file, libkvcache.so's file name.
VERSION ?= 0.1.0
# The ABI's number, libkvcache.so's SONAME (libkvcache.so.$(SOVERSION)): raised
# whenever a change breaks programs linked against an earlier build.
SOVERSION ?= 0
TEST_PYTHON ?= $(VENV)/bin/python
# the venv is made and filled only when the tests run with it
PY_DEPS := $(if $(filter $(VENV)/bin/python,$(TEST_PYTHON)),$(VENV)/.installed)

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) $(MARCH) -g $(WARN) -fPIC -Iinclude $(CFLAGS)
LDLIBS_ALL := -lpthread -lm

LIB_SRC    := $(wildcard src/*.c)
ENGINE_SRC := $(wildcard engine/*.c engine/*/*.c)
CLI_SRC    := $(wildcard cli/*.c)
SERVER_SRC := $(wildcard server/*.c)
TEST_SRC   := $(wildcard tests/*.c)

LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/%.o)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/%.o)
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ   := $(TEST_SRC:%.c=$(BUILD)/%.o)

# The library exports only what include/kvcache.h marks KV_API; libkvengine.so
# adds what include/kvengine.h marks KVE_API.
$(LIB_OBJ) $(ENGINE_OBJ): CFLAGS_ALL += -fvisibility=hidden

# SIMD variants are compiled for their instruction set whatever MARCH says and
# picked at run time by CPU feature (src/attend.c).
# KERNEL_CFLAGS: extra flags for those files alone (the sanitizer build's).
# Their debug information is line tables only (-g1): their unrolled,
# specialized functions are the largest of the build, and tracking each
# local through them doubles gcc's compile time for locals that -O2 leaves
# "optimized out" anyway; a stack trace or a profile still names the file
# and line, and the code is the same either way.
# Their functions start on a cache line (-falign-functions=64): at gcc's 16,
# where a kernel landed moved with every change to the code linked before it,
# and its loops' speed moved with that (docs/PERFORMANCE.md, "Tuning record").
# Their tuning is fixed too (-mtune=generic): -march=native also sets the
# host's -mtune, and gcc 12 on a Zen 4 (tuned as znver3) spilled the 8-bit
# weight tiles' X vectors (docs/PERFORMANCE.md, "Tuning record").
KERNEL_FLAGS = -g1 -falign-functions=64 -mtune=generic $(KERNEL_CFLAGS)
# TEST_CFLAGS: extra flags for the test files alone (the sanitizer build's).
$(TEST_OBJ): CFLAGS_ALL += $(TEST_CFLAGS)
$(BUILD)/src/%_avx2.o:   CFLAGS_ALL += -mavx2 -mfma -mf16c $(KERNEL_FLAGS)
$(BUILD)/src/%_avx512.o: CFLAGS_ALL += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c $(KERNEL_FLAGS)
$(BUILD)/engine/%_avx2.o:   CFLAGS_ALL += -mavx2 -mfma -mf16c $(KERNEL_FLAGS)
$(BUILD)/engine/%_avx512.o: CFLAGS_ALL += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c $(KERNEL_FLAGS)
$(BUILD)/engine/%_avx512vnni.o: CFLAGS_ALL += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma \
                                   -mf16c $(KERNEL_FLAGS)
# The int8-activation kernels promise the scalar reference's bits: no mul+add
# may be fused into an FMA behind their back (clang fuses by default).
$(BUILD)/engine/weights/quant%.o: CFLAGS_ALL += -ffp-contract=off
$(BUILD)/engine/weights/quant_avx512.o $(BUILD)/engine/weights/quant_avx512vnni.o: engine/weights/quant_avx2.c engine/weights/quant_act_avx2.c
# simd_avx512.c is simd_avx2.c compiled again at the AVX-512 width (src/simd_vec.h).
$(BUILD)/src/simd_avx512.o: src/simd_avx2.c

# Only server/ (and so the kvcache binary) uses these Debian-packaged
# libraries (libcivetweb-dev, libjansson-dev; scripts/deps.sh). civetweb ships
# no pkg-config file on Debian 12, hence the fallback.
SERVER_CFLAGS := $(shell pkg-config --cflags civetweb jansson 2>/dev/null || pkg-config --cflags jansson 2>/dev/null)
SERVER_LIBS   := $(shell pkg-config --libs civetweb jansson 2>/dev/null || \
                   echo "-lcivetweb $$(pkg-config --libs jansson 2>/dev/null || echo -ljansson)")
# libzmq (libzmq3-dev): --kv-events' PUB socket (server/events.c).
SERVER_CFLAGS += $(shell pkg-config --cflags libzmq 2>/dev/null)
SERVER_LIBS   += $(shell pkg-config --libs libzmq 2>/dev/null || echo -lzmq)
$(SERVER_OBJ): CFLAGS_ALL += $(SERVER_CFLAGS)
# Only the kvcache binary links libedit (libedit-dev): chat's line editing.
LINEEDIT_CFLAGS := $(shell pkg-config --cflags-only-other libedit 2>/dev/null)
LINEEDIT_LIBS   := $(shell pkg-config --libs libedit 2>/dev/null || echo -ledit)
$(BUILD)/cli/lineedit.o: CFLAGS_ALL += $(LINEEDIT_CFLAGS)
$(BUILD)/cli/main.o: CFLAGS_ALL += -DKVCACHE_VERSION='"$(VERSION)"'
$(BUILD)/cli/main.o: Makefile

.PHONY: all lib test test-all test-c test-cli test-python test-server test-server-asan test-asan test-portable test-threads deps run \
        bench model test-models install uninstall clean fuzz examples test-install install-python

all: lib $(BUILD)/kvcache
lib: $(BUILD)/libkvcache.a $(BUILD)/libkvcache.so $(BUILD)/libkvengine.so

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h engine/*.h engine/*/*.h cli/*.h server/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/libkvcache.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libkvcache.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libkvcache.so.$(SOVERSION) -o $@ $^ $(LDFLAGS) $(LDLIBS_ALL)

$(BUILD)/libkvengine.a: $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The engine with the library inside it: one file for a program (or Python)
# that generates; it exports kvengine.h's and kvcache.h's functions.
$(BUILD)/libkvengine.so: $(ENGINE_OBJ) $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libkvengine.so.$(SOVERSION) -o $@ $^ $(LDFLAGS) $(LDLIBS_ALL)

$(BUILD)/kvcache: $(CLI_OBJ) $(SERVER_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a
	$(CC) $(CFLAGS_ALL) -o $@ $(CLI_OBJ) $(SERVER_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a $(LDFLAGS) \
	    $(SERVER_LIBS) $(LINEEDIT_LIBS) $(LDLIBS_ALL)

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a
	$(CC) $(CFLAGS_ALL) -o $@ $(TEST_OBJ) $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a $(LDFLAGS) $(LDLIBS_ALL)

# ---------------------------------------------------------------- tests
TEST_JOBS ?= 2
test-c: $(BUILD)/run_tests $(BUILD)/kvcache $(MODEL) $(GEMMA_MODEL)
	KVCACHE_TEST_JOBS=$(TEST_JOBS) KVCACHE_BIN=$(BUILD)/kvcache $(BUILD)/run_tests

# The Debian packages first (scripts/deps.sh installs or says how), then the rest.
test: deps
	@$(MAKE) --no-print-directory test-all

# kvcache serve over HTTP with the official openai client (and curl), on the
# real model: each test starts its own server on a free loopback port. The
# files go to two pytest workers (pytest-xdist): a test spends much of its
# time in the client and between requests, and the other worker's server
# uses it.
SERVER_WORKERS ?= -n 2 --dist loadfile
test-server: $(BUILD)/kvcache $(MODEL) $(GEMMA_MODEL) $(PY_DEPS)
	KVCACHE_BIN=$(abspath $(BUILD))/kvcache KVCACHE_SERVE_MODEL=$(abspath $(MODEL)) $(TEST_PYTHON) -m pytest -q \
	    $(SERVER_WORKERS) tests/server

# kvcache chat on a pseudo-terminal (Python's pty): Ctrl-C, history, Ctrl-D; bench model rows as measured.
test-cli: $(BUILD)/kvcache $(MODEL) $(GEMMA_MODEL) $(PY_DEPS)
	KVCACHE_BIN=$(abspath $(BUILD))/kvcache KVCACHE_CHAT_MODEL=$(abspath $(MODEL)) $(TEST_PYTHON) -m pytest -q tests/cli

test-all: test-c examples test-install test-python test-server test-cli

deps:
	@sh scripts/deps.sh

# A virtual environment with the Python test packages, made on first use.
$(VENV)/.installed: python/requirements-test.txt
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV) || { \
	    echo "make: '$(PYTHON) -m venv $(VENV)' failed (Debian: python3-venv, see scripts/deps.sh)"; exit 1; }
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
	@touch $@

test-python: $(BUILD)/libkvcache.so $(BUILD)/libkvengine.so $(BUILD)/kvcache $(MODEL) $(GEMMA_MODEL) $(PY_DEPS)
	KVCACHE_LIB=$(abspath $(BUILD))/libkvcache.so KVCACHE_ENGINE_LIB=$(abspath $(BUILD))/libkvengine.so \
	    KVCACHE_BIN=$(abspath $(BUILD))/kvcache KVCACHE_MODEL=$(abspath $(MODEL)) \
	    PYTHONPATH=python $(TEST_PYTHON) -m pytest -q python/tests

# The sanitizer and scalar-kernel runs leave out the slowest real-model tests
# (perplexity over the text file, Gemma's long window run, the attention bench,
# the greedy runs on 1, 2 and 3 threads, Gemma's decode floor at depth 600,
# the CLI's penalty runs, whose sampler step the C sampler tests cover, the
# grammar mask over a 150k vocabulary, and the sampler's whole-vocabulary
# draws against a double reference, 85 s under ASan):
# the plain run keeps them, and the same code paths run under the sanitizers
# through the tiny models and the shorter real-model tests.
# They also set KVCACHE_TEST_QUICK (tests/test.h): the longest kernel and
# attention sweeps take every shape and path but fewer random draws there.
# The scalar run takes the tests that compute with the kernels (the kernels',
# the models', attention's) and leaves out those of logic the kernels do not
# change (the scheduler's, the cache policies', the CLI's, the disk tier's,
# kvengine.h's calls, the window's memory over 4096 tokens), which the
# portable build runs just before it, and a real-model run of a minute there
# (cached decode against recomputation).
SCALAR_LEFT_OUT := sched_,policy_,cli_,tier_,kvengine_,window_layers_memory,engine_real_cached_decode_equals_full_recompute
SLOW_TESTS := perplexity,past_the_window,bench_attention_json,gemma3_real_greedy,engine_real_greedy_output,bench_model_floor,penalties_and_stop_strings,gbnf_mask_matches,gbnf_greedy,sampler_draws_match_a_double_reference

test-asan: deps
	KVCACHE_TEST_QUICK=1 KVCACHE_TEST_EXCLUDE=$(SLOW_TESTS) $(MAKE) $(ASAN_FLAGS) test-c

# kvcache serve built with AddressSanitizer + UBSan, in test-asan's folder
# (build-asan: the same flags, so the libraries compile once for both), under
# the server tests that reach the HTTP, JSON, tokenizing and --kv-events code with
# short generations: SERVER_ASAN_TESTS, a pytest -k expression. A report ends
# the server with a nonzero status, and every test checks that status at
# SIGTERM; leaks are reported at that exit too. Session files are read by C
# code that the C suite runs under ASan and fuzz_session fuzzes.
SERVER_ASAN_TESTS ?= test_hardening or test_kv_events or (test_server and not equals and not concurrent)
test-server-asan: deps $(MODEL) $(PY_DEPS)
	$(MAKE) --no-print-directory $(ASAN_FLAGS) build-asan/kvcache
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 KVCACHE_BIN=$(abspath build-asan)/kvcache \
	    KVCACHE_SERVE_MODEL=$(abspath $(MODEL)) $(TEST_PYTHON) -m pytest -q -p no:cacheprovider $(SERVER_WORKERS) tests/server \
	    -k "$(SERVER_ASAN_TESTS)"

# The Python thread tests, the C concurrent-call tests and the disk tier's
# reader and writer threads beside the scheduler under ThreadSanitizer
# (gcc's: its runtime can be preloaded into a Python that was not built with it,
# clang 14's faults when preloaded), then the Python thread tests once more
# under AddressSanitizer + UBSan (clang's runtime, preloaded). Any report fails.
# Its run_tests holds only the files of the C thread tests (THREAD_TESTS) and
# what they use.
THREAD_TESTS := concurrent,thread_count,tier_scheduler
TSAN_FLAGS := BUILD=build-tsan OPT=-O1 CC=gcc CFLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
              LDFLAGS="-fsanitize=thread" \
              TEST_SRC="tests/main.c tests/test_kernels.c tests/test_tier.c tests/ref.c tests/test_model_fixture.c tests/gguf_writer.c"
# (fuzzer-no-link too: the fuzz targets link this same build, so the slow
# sanitizer compile of the SIMD kernels happens once). UBSan's checks are
# compiled recoverable and made fatal at run time by UBSAN_OPTIONS: clang 14
# compiles the unrolled kernels 2.5x slower with -fno-sanitize-recover. The
# SIMD kernel files leave out two costly parts that they do not need: the
# fuzzers' coverage (no fuzz target reaches them) and UBSan (its checks are of
# scalar arithmetic and pointers, and the kernels' arithmetic is vector
# intrinsics; ASan still checks every access against its object's bounds):
# with UBSan, clang took minutes on the AVX-512 product kernels alone. The
# test files leave out the coverage too: no fuzz target links them, and it
# took a quarter of the float64 oracles' time.
ASAN_FLAGS := BUILD=build-asan OPT=-O1 CC=clang \
              CFLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
              KERNEL_CFLAGS="-fno-sanitize=fuzzer-no-link,undefined" TEST_CFLAGS=-fno-sanitize=fuzzer-no-link \
              LDFLAGS="-fsanitize=address,undefined"
export UBSAN_OPTIONS := halt_on_error=1:print_stacktrace=1
PY_THREAD_TESTS := PYTHONPATH=python $(TEST_PYTHON) -m pytest -q -p no:cacheprovider --capture=sys \
                   python/tests/test_threads.py
test-threads: deps $(PY_DEPS)
	$(MAKE) --no-print-directory $(TSAN_FLAGS) build-tsan/run_tests build-tsan/libkvcache.so
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" KVCACHE_TEST_JOBS=2 build-tsan/run_tests $(THREAD_TESTS)
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" LD_PRELOAD=$$(gcc -print-file-name=libtsan.so) \
	    KVCACHE_LIB=$(abspath build-tsan)/libkvcache.so $(PY_THREAD_TESTS)
	$(MAKE) --no-print-directory $(ASAN_FLAGS) build-asan/libkvcache.so
	ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$$(clang -print-file-name=libclang_rt.asan-x86_64.so) \
	    KVCACHE_LIB=$(abspath build-asan)/libkvcache.so $(PY_THREAD_TESTS)


# A portable build still runs the SIMD kernels (chosen by CPUID); the second
# run forces the scalar ones everywhere (library and engine) through KVCACHE_SIMD;
# then kvcache.Model on the portable libkvengine.so (what `pip install ./python`
# ships) generates with the AVX2 and the scalar kernels forced.
test-portable: deps $(MODEL) $(PY_DEPS)
	KVCACHE_TEST_QUICK=1 KVCACHE_TEST_EXCLUDE=$(SLOW_TESTS) $(MAKE) BUILD=build-portable MARCH= test-c
	KVCACHE_TEST_QUICK=1 KVCACHE_TEST_EXCLUDE=$(SLOW_TESTS),$(SCALAR_LEFT_OUT) KVCACHE_SIMD=scalar $(MAKE) BUILD=build-portable MARCH= test-c
	$(MAKE) --no-print-directory BUILD=build-portable MARCH= build-portable/libkvcache.so build-portable/libkvengine.so
	KVCACHE_LIB=$(abspath build-portable)/libkvcache.so KVCACHE_ENGINE_LIB=$(abspath build-portable)/libkvengine.so \
	    KVCACHE_MODEL=$(abspath $(MODEL)) PYTHONPATH=python $(TEST_PYTHON) -m pytest -q -p no:cacheprovider \
	    python/tests/test_generate.py -k forced_kernels

# ---------------------------------------------------------------- examples
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
$(BUILD)/examples/%: examples/%.c $(BUILD)/libkvcache.a include/kvcache.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libkvcache.a $(LDLIBS_ALL)
$(BUILD)/examples/readme_generate: examples/readme_generate.c $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a \
                                   include/kvengine.h include/kvcache.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libkvengine.a $(BUILD)/libkvcache.a $(LDLIBS_ALL)
PY_EXAMPLES := $(wildcard examples/*.py)
examples: $(EXAMPLES) $(BUILD)/libkvcache.so $(BUILD)/kvcache $(if $(PY_EXAMPLES),$(PY_DEPS))
	@sh scripts/check-readme.sh $(BUILD)
	@for e in $(EXAMPLES); do echo "== $$e"; $$e > /dev/null || exit 1; done
	@for e in $(PY_EXAMPLES); do echo "== $$e"; \
	    KVCACHE_LIB=$(abspath $(BUILD))/libkvcache.so PYTHONPATH=python $(TEST_PYTHON) $$e > /dev/null || exit 1; done

# ---------------------------------------------------------------- running
model: $(MODEL)
# the models the tests read
test-models: $(MODEL) $(GEMMA_MODEL)
$(MODEL):
	sh scripts/fetch-model.sh $(MODEL)
$(GEMMA_MODEL):
	sh scripts/fetch-model.sh gemma3-270m $(GEMMA_MODEL)

# The main job: a chat-formatted prompt answered by the default model, greedy,
# streamed; speed and KV bytes on stderr. `kvcache demo` is the synthetic loop.
PROMPT ?= Explain in three sentences why a language model keeps a cache of keys and values.
run: all $(MODEL)
	$(BUILD)/kvcache generate -m $(MODEL) --chat -p "$(PROMPT)" -n 200 --temp 0

bench: all
	$(BUILD)/kvcache bench attention

# ---------------------------------------------------------------- install
# PREFIX/include/kvcache.h, PREFIX/lib/libkvcache.a, PREFIX/lib/libkvcache.so.VERSION with
# the links libkvcache.so.SOVERSION (what programs load) and libkvcache.so (what -lkvcache
# finds), PREFIX/lib/pkgconfig/kvcache.pc, PREFIX/bin/kvcache,
# PREFIX/share/man/man1/kvcache.1; DESTDIR stages them elsewhere. The pkg-config file
# gives -Wl,-rpath,PREFIX/lib, so that a program linked through it finds the library
# under any PREFIX without LD_LIBRARY_PATH or ldconfig.
INSTALLED := include/kvcache.h lib/libkvcache.a lib/libkvcache.so lib/libkvcache.so.$(SOVERSION) \
             lib/libkvcache.so.$(VERSION) lib/pkgconfig/kvcache.pc bin/kvcache share/man/man1/kvcache.1 \
             include/kvengine.h lib/libkvengine.a lib/libkvengine.so lib/libkvengine.so.$(SOVERSION) \
             lib/libkvengine.so.$(VERSION) lib/pkgconfig/kvengine.pc
install: all $(BUILD)/libkvengine.so
	install -d $(addprefix $(DESTDIR)$(PREFIX)/,include lib/pkgconfig bin share/man/man1)
	install -m 644 include/kvcache.h include/kvengine.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libkvcache.a $(BUILD)/libkvengine.a $(DESTDIR)$(PREFIX)/lib/
	for l in kvcache kvengine; do \
	    install -m 755 $(BUILD)/lib$$l.so $(DESTDIR)$(PREFIX)/lib/lib$$l.so.$(VERSION) && \
	    ln -sf lib$$l.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/lib$$l.so.$(SOVERSION) && \
	    ln -sf lib$$l.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/lib$$l.so || exit 1; \
	done
	install -m 755 $(BUILD)/kvcache $(DESTDIR)$(PREFIX)/bin/
	install -m 644 docs/kvcache.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	for l in kvcache kvengine; do \
	    sed -e 's|@PREFIX@|$(abspath $(PREFIX))|' -e 's|@VERSION@|$(VERSION)|' $$l.pc.in \
	        > $(DESTDIR)$(PREFIX)/lib/pkgconfig/$$l.pc && chmod 644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/$$l.pc || exit 1; \
	done

uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALLED))

# Installs into a temporary prefix, checks the library's SONAME and links,
# compiles examples/readme_decode.c against it with pkg-config's flags, shared
# (run as it is: no LD_LIBRARY_PATH, the run path finds the library) and
# static, runs both, and checks that uninstall leaves no file behind.
test-install: all $(BUILD)/libkvengine.so $(MODEL)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(MAKE) --no-print-directory -s install PREFIX=$$tmp/usr > /dev/null; \
	export PKG_CONFIG_PATH=$$tmp/usr/lib/pkgconfig; \
	flags=$$(pkg-config --cflags --libs kvcache); \
	echo "test-install: pkg-config --cflags --libs kvcache: $$flags"; \
	lib=$$tmp/usr/lib; \
	soname=$$(objdump -p $$lib/libkvcache.so.$(VERSION) | awk '$$1 == "SONAME" { print $$2 }'); \
	[ "$$soname" = libkvcache.so.$(SOVERSION) ] || { echo "test-install: SONAME '$$soname'"; exit 1; }; \
	[ "$$(readlink $$lib/libkvcache.so)" = libkvcache.so.$(SOVERSION) ] && \
	[ "$$(readlink $$lib/libkvcache.so.$(SOVERSION))" = libkvcache.so.$(VERSION) ] || { \
	    echo "test-install: links:"; ls -l $$lib; exit 1; }; \
	$(CC) -std=c11 -o $$tmp/shared examples/readme_decode.c $$flags; \
	env -u LD_LIBRARY_PATH ldd $$tmp/shared | grep -q "$$lib/libkvcache.so.$(SOVERSION)" || { \
	    echo "test-install: the program does not find the installed library:"; env -u LD_LIBRARY_PATH ldd $$tmp/shared; exit 1; }; \
	out=$$(env -u LD_LIBRARY_PATH $$tmp/shared); echo "test-install: shared, no LD_LIBRARY_PATH: $$out"; \
	$(CC) -std=c11 -o $$tmp/static examples/readme_decode.c $$(pkg-config --cflags kvcache) \
	    $$(pkg-config --static --libs kvcache | sed 's/-lkvcache/-l:libkvcache.a/'); \
	if ldd $$tmp/static | grep -q libkvcache; then echo "test-install: static build loads libkvcache.so"; exit 1; fi; \
	out=$$($$tmp/static); echo "test-install: static: $$out"; \
	$$tmp/usr/bin/kvcache --help > /dev/null; \
	$(CC) -std=c11 -o $$tmp/generate examples/readme_generate.c $$(pkg-config --cflags --libs kvengine); \
	env -u LD_LIBRARY_PATH ldd $$tmp/generate | grep -q "$$lib/libkvengine.so.$(SOVERSION)" || { \
	    echo "test-install: readme_generate does not find the installed libkvengine:"; \
	    env -u LD_LIBRARY_PATH ldd $$tmp/generate; exit 1; }; \
	out=$$(env -u LD_LIBRARY_PATH $$tmp/generate $(MODEL)) || { echo "test-install: readme_generate failed"; exit 1; }; \
	echo "test-install: readme_generate (pkg-config kvengine): $$out"; \
	$(MAKE) --no-print-directory -s uninstall PREFIX=$$tmp/usr; \
	left=$$(find $$tmp/usr -type f -o -type l); \
	if [ -n "$$left" ]; then echo "test-install: uninstall left $$left"; exit 1; fi; \
	echo "test-install: install, SONAME and links, pkg-config, shared and static builds, uninstall: ok"

# The Python package into the current environment (see python/README.md), with
# the portable libraries (generic code for any x86-64, SIMD kernels chosen at run time).
install-python:
	$(PYTHON) -m pip install ./python

# ---------------------------------------------------------------- fuzzing
# Every tests/fuzz/fuzz_NAME.c is a libFuzzer target, seeded from
# tests/fuzz/corpus_NAME when present, run for FUZZ_SECONDS each; each is its
# own target, so that make -j2 fuzz builds and runs two at a time.
FUZZ_SECONDS ?= 60
FUZZ_RUNS := $(patsubst tests/fuzz/%.c,build-fuzz/%.done,$(wildcard tests/fuzz/fuzz_*.c))
# The libraries are test-asan's build (ASAN_FLAGS carries fuzzer-no-link).
fuzz: deps
	$(MAKE) $(ASAN_FLAGS) build-asan/libkvengine.a build-asan/libkvcache.a
	@rm -f $(FUZZ_RUNS)
	@$(MAKE) --no-print-directory $(FUZZ_RUNS)

build-fuzz/fuzz_request.done: FUZZ_EXTRA = server/request.c $(SERVER_CFLAGS) $(SERVER_LIBS)
build-fuzz/%.done: tests/fuzz/%.c
	@mkdir -p build-fuzz/corpus_$*
	@clang -g -O1 -march=native -fsanitize=fuzzer,address,undefined -Iinclude -Iengine $< $(FUZZ_EXTRA) \
	    build-asan/libkvengine.a build-asan/libkvcache.a -lm -lpthread -o build-fuzz/$*
	@seeds=tests/fuzz/corpus_$(patsubst fuzz_%,%,$*); \
	build-fuzz/$* -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus_$* $$( [ -d $$seeds ] && echo $$seeds ) \
	    > build-fuzz/$*.log 2>&1; rc=$$?; \
	echo "== $*: $(FUZZ_SECONDS) s"; tail -2 build-fuzz/$*.log; \
	if [ $$rc -ne 0 ]; then tail -40 build-fuzz/$*.log; echo "== $* FAILED"; exit 1; fi
	@touch $@

clean:
	rm -rf build build-asan build-portable build-fuzz build-tsan
