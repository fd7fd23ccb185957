/* tests/test_cli.c - smoke tests of the `kvcache` command on a tiny model the
 * test writes (tests/test_model_fixture.h): every subcommand's --help, exit
 * codes for bad usage (2) and a missing model (1, with how to get one), and
 * what each prints. Runs the kvcache binary that sits next to this test
 * runner (build/ or build-asan/). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "test_model_fixture.h"
#include "gguf_writer.h"
#include "real_model.h"
#include "../engine/gguf/gguf.h"
#include "../engine/text/tokenizer.h"

typedef struct {
    int status;   /* exit status, or -1 when it did not exit normally */
    char *out;    /* stdout, NUL-terminated */
    char *err;    /* stderr, NUL-terminated */
} result;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 1 << 20);
    if (f && buf) buf[fread(buf, 1, (1 << 20) - 1, f)] = 0;
    if (f) fclose(f);
    return buf;
}

/* Runs `kvcache ARGS` with stdin_text (or nothing) as its input. */
static result run(const char *args, const char *stdin_text) {
    char exe[PATH_MAX] = "", cmd[8192], in[64], out[64], err[64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
    if (n > 0) {
        exe[n] = 0;
        strcpy(strrchr(exe, '/') + 1, "kvcache");
    }
    int pid = (int)getpid();
    snprintf(in, sizeof in, "/tmp/kvcache_cli_%d.in", pid);
    snprintf(out, sizeof out, "/tmp/kvcache_cli_%d.out", pid);
    snprintf(err, sizeof err, "/tmp/kvcache_cli_%d.err", pid);
    FILE *f = fopen(in, "wb");
    if (f) fputs(stdin_text ? stdin_text : "", f), fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s < %s > %s 2> %s", exe, args, in, out, err);
    int st = system(cmd);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err)};
    remove(in), remove(out), remove(err);
    return r;
}

static void done(result *r) { free(r->out), free(r->err); }

/* Runs and checks the exit status, printing the output when it is not. */
static result expect(const char *args, const char *stdin_text, int status, int line) {
    result r = run(args, stdin_text);
    if (r.status != status)
        test_fail(__FILE__, line, "`kvcache %s` exited %d, expected %d\nstdout: %.2000s\nstderr: %.2000s", args,
                  r.status, status, r.out, r.err);
    return r;
}
#define EXPECT(args, in, st) expect(args, in, st, __LINE__)

/* The number after "key": in a JSON object, or NAN. */
static double json_num(const char *js, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(js, pat);
    if (!p) return NAN;
    char *end;
    double v = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? NAN : v;
}

static const char *tiny_model(fx_model *fx) {
    return fx_build(&(fx_spec){.type = GW_Q8_0, .seed = 77, .tied = 1}, fx) ? NULL : fx->path;
}

TEST(cli_every_subcommand_has_help_and_bad_usage_exits_2) {
    result r = EXPECT("--help", NULL, 0);
    const char *cmds[] = {"generate", "chat", "perplexity", "bench", "verify", "price", "info", "demo"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strstr(r.out, cmds[i])) test_fail(__FILE__, __LINE__, "--help does not list %s", cmds[i]);
    done(&r);
    r = EXPECT("", NULL, 2), done(&r);
    r = EXPECT("no-such-command", NULL, 2), done(&r);
    const char *sub[] = {"generate", "chat", "perplexity", "bench model", "verify", "price", "info", "bench",
                         "tokenize"};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        char args[64], want[64];
        snprintf(args, sizeof args, "%s --help", sub[i]);
        r = EXPECT(args, NULL, 0);
        snprintf(want, sizeof want, "usage: kvcache %s", sub[i]);
        if (!strstr(r.out, want)) test_fail(__FILE__, __LINE__, "`%s` prints no '%s'", args, want);
        done(&r);
        snprintf(args, sizeof args, "%s --no-such-option", sub[i]);
        r = EXPECT(args, NULL, 2), done(&r);
    }
    r = EXPECT("bench", NULL, 2), done(&r);
    r = EXPECT("generate -p hi -n", NULL, 2); /* an option without its value */
    CHECK(strstr(r.err, "needs a value") != NULL);
    done(&r);
    r = EXPECT("generate -p hi --temp warm", NULL, 2), done(&r);
    r = EXPECT("generate", NULL, 2); /* no prompt */
    CHECK(strstr(r.err, "-p") != NULL);
    done(&r);
}

TEST(cli_a_missing_model_exits_1_and_says_how_to_get_one) {
    const char *cmds[] = {"generate -p hi", "chat", "perplexity -f tests/data/perplexity_en.txt", "bench model",
                          "verify", "info", "price"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s -m /nonexistent/model.gguf", cmds[i]);
        result r = EXPECT(args, NULL, 1);
        if (!strstr(r.err, "make model") || !strstr(r.err, "/nonexistent/model.gguf"))
            test_fail(__FILE__, __LINE__, "`%s` does not say how to get a model: %s", args, r.err);
        done(&r);
    }
    /* a file that is not a model */
    result r = EXPECT("generate -p hi -m tests/data/perplexity_en.txt", NULL, 1);
    CHECK(strstr(r.err, "cannot load model") != NULL);
    done(&r);
}

TEST(cli_generate_streams_text_then_reports_speed_and_kv_bytes) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "generate -m %s -p 'hello there' -n 12 --temp 0 -t 2", path);
    result a = EXPECT(args, NULL, 0), b = EXPECT(args, NULL, 0);
    CHECK(strlen(a.out) > 1);
    CHECK(strcmp(a.out, b.out) == 0); /* greedy is deterministic */
    /* bytes, merged by "h e" and "Ġ t": he l l o Ġt he r e */
    CHECK(strstr(a.err, "prefill: 8 tokens") != NULL);
    CHECK(strstr(a.err, "decode:") && strstr(a.err, "tokens/s"));
    /* 2 x 2 layers x 2 KV heads x 64 x 2 B of f16 */
    CHECK(strstr(a.err, "1024 bytes/token") != NULL);
    CHECK(strstr(a.err, "bytes in use") != NULL);
    done(&a), done(&b);
    snprintf(args, sizeof args, "generate -m %s -p hi --kv-type f8", path);
    a = EXPECT(args, NULL, 2);
    CHECK(strstr(a.err, "--kv-type") != NULL);
    done(&a);
    snprintf(args, sizeof args, "generate -m %s -p hi -n 4 --temp 0.9 --top-k 5 --top-p 0.9 --seed 3 --kv-type q8 --chat", path);
    a = EXPECT(args, NULL, 0), done(&a);
    fx_free(&fx);
}

TEST(cli_bench_model_json_has_the_documented_keys) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "bench model -m %s -p 32 -n 8 -r 2 --depth 40 -t 2 --json", path);
    result r = EXPECT(args, NULL, 0);
    CHECK(r.out[0] == '{' && strchr(r.out, '}') && strchr(r.out, '}')[1] == '\n');
    CHECK(json_num(r.out, "prefill_tps") > 0);
    CHECK(json_num(r.out, "decode_tps") > 0);
    CHECK(json_num(r.out, "threads") == 2);
    CHECK(json_num(r.out, "depth") == 40);
    CHECK(json_num(r.out, "reps") == 2);
    /* the decode row's ratio to its floor, and the last-level cache against the weights */
    const char *dec = strstr(r.out, "\"decode_tps\"");
    CHECK(dec != NULL);
    if (dec) {
        double tps = json_num(dec, "decode_tps"), floor = json_num(dec, "floor_tps");
        CHECK(floor > 0);
        CHECK_NEAR(json_num(dec, "floor_ratio"), tps / floor, 1e-3 + 1e-3 * tps / floor);
        unsigned long long llc = 0; /* the biggest data or unified cache of the deepest level in sysfs */
        for (int i = 0, deepest = 0; i < 16; i++) {
            char cmd[256];
            snprintf(cmd, sizeof cmd, "d=/sys/devices/system/cpu/cpu0/cache/index%d; [ -r $d/size ] && "
                     "[ \"$(cat $d/type)\" != Instruction ] && echo $(cat $d/level) $(numfmt --from=iec $(cat $d/size))", i);
            FILE *p = popen(cmd, "r");
            int level;
            unsigned long long size;
            if (p && fscanf(p, "%d %llu", &level, &size) == 2 && (level > deepest || (level == deepest && size > llc)))
                deepest = level, llc = size;
            if (p) pclose(p);
        }
        if (llc) {
            CHECK(json_num(dec, "llc_bytes") == (double)llc);
            const char *obj = dec;
            while (obj > r.out && obj[-1] != '\n') obj--;
            const char *fit = json_num(obj, "streamed_bytes") <= (double)llc ? "\"weights_fit_llc\": true"
                                                                              : "\"weights_fit_llc\": false";
            CHECK(strstr(dec, fit) != NULL);
        }
    }
    done(&r);
    /* lists, as llama-bench takes them: a row per depth and size, in that order (issue 45.3) */
    snprintf(args, sizeof args, "bench model -m %s -p 16,24 -n 4 --depth 0,20 -r 1", path);
    r = EXPECT(args, NULL, 0);
    const char *rows[] = {"prefill  16     d0 ", "prefill  24     d0 ", "decode   4      d0 ",
                          "prefill  16     d20 ", "prefill  24     d20 ", "decode   4      d20 "};
    const char *at = r.out;
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        if (!at || !(at = strstr(at, rows[k])))
            test_fail(__FILE__, __LINE__, "no row '%s' after the ones before it:\n%s", rows[k], r.out);
    done(&r);
    snprintf(args, sizeof args, "bench model -m %s -p 16 -n 4,6 --depth 0,20 -r 1 --json", path);
    r = EXPECT(args, NULL, 0);
    int objects = 0;
    for (const char *l = r.out; (l = strchr(l, '{')); l++) objects++;
    CHECK(objects == 6); /* JSON Lines: one object per row */
    done(&r);
    snprintf(args, sizeof args, "bench model -m %s -p 0 -n 0", path);
    r = EXPECT(args, NULL, 2), done(&r);
    fx_free(&fx);
    /* gemma3: each run passes the window (8), so the depth is prefilled again between
     * runs; the bytes each layer group holds after a decode run come as an array */
    if (fx_build(&(fx_spec){.type = GW_Q8_0, .arch = "gemma3", .seed = 80}, &fx)) return;
    snprintf(args, sizeof args, "bench model -m %s -p 32 -n 8 -r 2 --depth 40 -t 2 --json", fx.path);
    r = EXPECT(args, NULL, 0);
    const char *arr = strstr(r.out, "\"kv_bytes_in_use\": [");
    CHECK(arr != NULL && json_num(r.out, "decode_tps") > 0);
    unsigned long long full = 0, win = 0;
    if (arr) sscanf(arr + strlen("\"kv_bytes_in_use\": ["), "%llu, %llu", &full, &win);
    /* 48 positions (pages of 16 positions x K and V x 128 x 2 B): 3 pages in the one full
     * layer; the window of 8 keys, 40..47, one page in each of the 5 window layers */
    CHECK(full == 3 * 16 * 2 * 128 * 2ull && win == 5 * 16 * 2 * 128 * 2ull);
    done(&r);
    fx_free(&fx);
}

/* The last line of s that starts with prefix, or NULL. */
static const char *line_with(const char *s, const char *prefix) {
    const char *found = NULL;
    for (const char *p = s; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, strlen(prefix))) found = p;
    return found;
}

TEST(cli_perplexity_prints_ppl_and_prices_a_kv_type_by_kl_divergence) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512], kl[64];
    snprintf(kl, sizeof kl, "/tmp/kvcache_cli_kl_%d", (int)getpid());
    remove(kl);
    /* the fixture's vocabulary is bytes: 600 characters are about 600 tokens */
    snprintf(args, sizeof args, "perplexity -m %s -f tests/data/perplexity_en.txt --ctx 64 --chunks 3 --kl-base %s", path, kl);
    result r = EXPECT(args, NULL, 0);
    const char *ppl = line_with(r.out, "ppl = ");
    CHECK(ppl != NULL && atof(ppl + 6) > 1);
    CHECK(strstr(r.out, "saved 93 x 261 log-probabilities") != NULL); /* 3 windows x 31 */
    CHECK(access(kl, R_OK) == 0);
    /* the same settings again: the same distribution, KL exactly 0 */
    result same = EXPECT(args, NULL, 0);
    CHECK(strstr(same.out, "mean KL divergence") && strstr(same.out, ": 0 (max 0)"));
    CHECK(strcmp(line_with(same.out, "ppl = "), ppl) == 0);
    done(&same);
    /* q8 K/V against the f16 base: a small positive divergence */
    snprintf(args, sizeof args, "perplexity -m %s -f tests/data/perplexity_en.txt --ctx 64 --chunks 3 --kl-base %s --kv-type q8",
             path, kl);
    result q8 = EXPECT(args, NULL, 0);
    const char *k = strstr(q8.out, "mean KL divergence from ");
    double v = k ? atof(strstr(k, ": ") + 2) : -1;
    CHECK(v > 0 && v < 0.01);
    done(&q8);
    /* another context length does not match the base */
    snprintf(args, sizeof args, "perplexity -m %s -f tests/data/perplexity_en.txt --ctx 32 --chunks 3 --kl-base %s", path, kl);
    result bad = EXPECT(args, NULL, 1);
    CHECK(strstr(bad.err, "another text, model or --ctx") != NULL);
    done(&bad);
    /* a text shorter than one window */
    snprintf(args, sizeof args, "perplexity -m %s -f tests/data/perplexity_en.txt --ctx 100000", path);
    bad = EXPECT(args, NULL, 1), done(&bad);
    remove(kl);
    done(&r);
    fx_free(&fx);
}

TEST(cli_verify_passes_on_f32_kv_and_fails_when_the_tolerance_is_too_tight) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "verify -m %s -n 32 -t 2", path);
    result r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.out, "PASS") != NULL);
    CHECK(strstr(r.out, "   32 ") != NULL); /* a line per step, up to step 32 */
    done(&r);
    /* q8 K/V differs from the exact recomputation by its rounding: not within 0 */
    snprintf(args, sizeof args, "verify -m %s -n 4 --kv-type q8 --tol 0", path);
    r = EXPECT(args, NULL, 1);
    CHECK(strstr(r.out, "FAIL") && strstr(r.out, "<- over tolerance"));
    done(&r);
    fx_free(&fx);
}

TEST(cli_price_reproduces_the_seed_figures_for_llama_3_1_8b) {
    result r = EXPECT("price --preset llama-3.1-8b --ctx 4096 --bandwidth 3350", NULL, 0);
    CHECK(strstr(r.out, "131,072 B (128.0 KiB)") != NULL);
    CHECK(strstr(r.out, "16.06 GB") != NULL);
    const char *row = strstr(r.out, "4,096 tokens");
    CHECK(row && strstr(row, "4.95 ms/token"));
    done(&r);
    r = EXPECT("price --preset llama-3.1-8b", NULL, 0); /* default --ctx 8192 */
    CHECK(strstr(r.out, "1,073,741,824 B (1.00 GiB) at 8,192 tokens") != NULL);
    done(&r);
    r = EXPECT("price --preset smollm2-135m --kv-type q8", NULL, 0);
    CHECK(strstr(r.out, "12,240 B") != NULL); /* 2 x 30 x 3 x (64 x 1 B + a 4 B scale) */
    done(&r);
    r = EXPECT("price", NULL, 2), done(&r);
    r = EXPECT("price --preset gpt-5", NULL, 2), done(&r);
    r = EXPECT("price --preset llama-3.1-8b --kv-type int3", NULL, 2), done(&r);
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "price -m %s --kv-type f32", path);
    r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.out, "2,048 B") != NULL); /* 2 x 2 x 2 x 64 x 4 */
    done(&r);
    snprintf(args, sizeof args, "info -m %s --tensors", path);
    r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.out, "llama.block_count") && strstr(r.out, "blk.1.ffn_down.weight"));
    CHECK(strstr(r.out, "engine: 2 layers, width 256, 4 heads over 2 KV heads of 64") != NULL);
    done(&r);
    fx_free(&fx);
}

/* `info` on a file whose header reads but whose tensors do not says which
 * tensor is wrong; on a loadable one it lists the layer groups. */
TEST(cli_info_says_why_a_model_cannot_load) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_F32, .arch = "qwen2", .seed = 79, .skip_tensor = "blk.1.attn_q.bias"}, &fx))
        return;
    char args[512];
    snprintf(args, sizeof args, "info -m %s", fx.path);
    result r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.out, "engine: cannot load this model: missing tensor blk.1.attn_q.bias") != NULL);
    done(&r);
    fx_free(&fx);
    if (fx_build(&(fx_spec){.type = GW_F32, .arch = "qwen3", .seed = 80, .head_dim = 128}, &fx)) return;
    snprintf(args, sizeof args, "info -m %s", fx.path);
    r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.out, "4 heads over 2 KV heads of 128") && strstr(r.out, "(split halves)"));
    CHECK(strstr(r.out, "layer groups (one cache each): 2 full-attention layers") != NULL);
    done(&r);
    fx_free(&fx);
}

/* A model with window layers is priced per group: the full layers per token,
 * the window layers bounded by their window and one chunk. */
TEST(cli_price_prices_gemma3_window_and_full_layers_apart) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_Q8_0, .arch = "gemma3", .seed = 78}, &fx)) return;
    char args[512];
    snprintf(args, sizeof args, "price -m %s --kv-type f32 --ctx 1000 -b 64", fx.path);
    result r = EXPECT(args, NULL, 0);
    /* one full layer and five window layers (W = 8) of one KV head of 128: 1,024 B per layer and position */
    CHECK(strstr(r.out, "6,144 B (6.0 KiB) = 2 x 6 x 1 x 128 x 4 B") != NULL);
    CHECK(strstr(r.out, " 1 full layers   1,024 B per token, every position kept: 1,024,000 B at 1,000 tokens") != NULL);
    CHECK(strstr(r.out, " 5 window layers 5,120 B per position, window 8: at most 368,640 B (72 positions") != NULL);
    CHECK(strstr(r.out, "1,392,640 B (0.00 GiB) at 1,000 tokens; 6,144,000 B without windows (4.4x)") != NULL);
    done(&r);
    fx_free(&fx);
}

/* generate on a gemma3 model reports each layer group's bytes; with
 * --no-window the window layers keep every position (5 window layers hold 5x
 * the one full layer's bytes) and the text is the same. */
TEST(cli_generate_reports_bytes_per_layer_group_and_no_window_keeps_them_all) {
    fx_model fx;
    if (fx_build(&(fx_spec){.type = GW_Q8_0, .arch = "gemma3", .seed = 79}, &fx)) return;
    char args[512], text[2][4096];
    const char *flags[2] = {"", " --no-window"};
    unsigned long long full[2] = {0, 0}, win[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "generate -m %s -p abcdefghijklmnopqrstuvwxyz0123456789 -n 40 --temp 0 -t 2%s",
                 fx.path, flags[k]);
        result r = EXPECT(args, NULL, 0);
        snprintf(text[k], sizeof text[k], "%s", r.out);
        const char *g = strstr(r.err, "1 full-attention layers"), *w = strstr(r.err, "5 window-8 layers");
        CHECK(g && w);
        if (g && w) {
            full[k] = strtoull(g + strlen("1 full-attention layers"), NULL, 10);
            win[k] = strtoull(w + strlen("5 window-8 layers") + (k ? strlen(" (--no-window)") : 0), NULL, 10);
        }
        done(&r);
    }
    CHECK(strcmp(text[0], text[1]) == 0);
    CHECK(full[0] > 0 && full[0] == full[1]);
    CHECK(win[1] == 5 * full[1]);     /* every position of 77, in pages of 16 */
    CHECK(win[0] < 5 * full[0] / 2);  /* the window (8) and the last page or two */
    fx_free(&fx);
}

TEST(cli_chat_keeps_the_cache_and_prefills_only_the_new_turn) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "chat -m %s -n 6 --temp 0 -t 2", path);
    result r = EXPECT(args, "hello\n/unknown is just text\n", 0);
    const char *t1 = strstr(r.err, "[turn 1: prefilled "), *t2 = strstr(r.err, "[turn 2: prefilled ");
    CHECK(t1 && t2);
    if (t1 && t2) {
        int new1 = atoi(t1 + 19), new2 = atoi(t2 + 19);
        const char *reused = strstr(t2, "new tokens (");
        int cached2 = reused ? atoi(reused + 12) : -1;
        CHECK(strstr(t1, "(0 reused") != NULL);
        /* turn 2 reuses all of turn 1 (prompt + 6 reply tokens + end marker) */
        CHECK_EQ_INT(cached2, new1 + 6 + 1);
        CHECK(new2 > 0 && new2 < new1 + 20);
    }
    done(&r);
    r = EXPECT(args, "one\n/reset\ntwo\n/exit\nnever read\n", 0);
    CHECK(strstr(r.err, "[new conversation]") != NULL);
    CHECK(strstr(r.err, "[turn 2: prefilled") && strstr(strstr(r.err, "[turn 2"), "(0 reused"));
    CHECK(!strstr(r.err, "[turn 3"));
    done(&r);
    fx_free(&fx);
}

TEST(cli_chat_reads_a_long_line_as_one_turn_and_refuses_it_whole_keeping_the_conversation) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "chat -m %s -n 4 --temp 0 -t 2 --ctx 512", path);
    /* 9,000 characters: more than any fixed line buffer, and (a token per byte) far more than 512 tokens */
    size_t n = 9000;
    char *in = malloc(n + 64);
    strcpy(in, "hello\n");
    memset(in + 6, 'a', n);
    strcpy(in + 6 + n, "\nbye\n");
    result r = EXPECT(args, in, 0);
    const char *msg = strstr(r.err, "this message is ");
    CHECK(msg != NULL);
    if (msg) {
        CHECK(atoi(msg + 16) > 9000);
        CHECK(strstr(msg, "the context holds 512") != NULL);
        CHECK(strstr(msg + 1, "this message is ") == NULL); /* refused once, as one turn */
    }
    CHECK(strstr(r.err, "new conversation") == NULL);
    /* the conversation went on: turn 2 ("bye") reuses all of turn 1 */
    const char *t1 = strstr(r.err, "[turn 1: prefilled "), *t2 = strstr(r.err, "[turn 2: prefilled ");
    CHECK(t1 && t2 && !strstr(r.err, "[turn 3"));
    if (t1 && t2) {
        const char *reused = strstr(t2, "new tokens (");
        CHECK_EQ_INT(reused ? atoi(reused + 12) : -1, atoi(t1 + 19) + 4 + 1);
    }
    done(&r);
    free(in);
    fx_free(&fx);
}

TEST(cli_generate_stops_cleanly_when_the_context_is_full) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    /* 8 prompt tokens in 16 positions: 8 generated, then a clean stop that says why */
    snprintf(args, sizeof args, "generate -m %s -p 'hello there' -n 100 --temp 0 --ctx 16", path);
    result r = EXPECT(args, NULL, 0);
    const char *dec = strstr(r.err, "decode:  ");
    if (!dec || atoi(dec + 9) != 8 || !strstr(dec, "stopped at context full"))
        test_fail(__FILE__, __LINE__, "no clean stop at a full context: %s", r.err);
    CHECK(strstr(r.err, "16 of 16 positions (prompt 8, generated 8)") != NULL);
    done(&r);
    /* a prompt that fills the context: refused with both numbers */
    snprintf(args, sizeof args, "generate -m %s -p 'hello there' -n 4 --ctx 8", path);
    r = EXPECT(args, NULL, 1);
    CHECK(strstr(r.err, "the prompt is 8 tokens; the context holds 8") != NULL);
    done(&r);
    fx_free(&fx);
}

/* Writes n bytes to a fresh file under /tmp named for this process and tag. */
static void write_bytes(char *path, size_t cap, const char *tag, const void *data, size_t n) {
    snprintf(path, cap, "/tmp/kvcache_cli_%s_%d", tag, (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f) fwrite(data, 1, n, f), fclose(f);
}

/* issue 10.4: a prompt file is read by its length, so a NUL byte is one more
 * byte token, not the end of the prompt (cli_tokenize used strlen). */
TEST(cli_a_nul_byte_in_a_prompt_file_is_tokenized_not_a_silent_cut) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char file[128], args[512];
    write_bytes(file, sizeof file, "nul", "hello\0there", 11);
    /* the fixture's merges give he l l o | NUL | t he r e: 9 tokens (no BOS);
     * cut at the NUL it would be 4 */
    snprintf(args, sizeof args, "generate -m %s -f %s -n 1 --temp 0", path, file);
    result r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.err, "prefill: 9 tokens") != NULL);
    done(&r);
    /* --chat renders the text into a template of strings: a NUL is refused
     * with where it is */
    snprintf(args, sizeof args, "generate -m %s -f %s -n 1 --temp 0 --chat", path, file);
    r = EXPECT(args, NULL, 1);
    CHECK(strstr(r.err, "NUL byte at offset 5") != NULL);
    done(&r);
    remove(file);
    /* perplexity over a text with a NUL near its start still sees the whole text */
    char *text = slurp("tests/data/perplexity_en.txt");
    size_t n = strlen(text);
    text[2] = 0;
    write_bytes(file, sizeof file, "nulppl", text, n);
    snprintf(args, sizeof args, "perplexity -m %s -f %s --ctx 64 --chunks 2", path, file);
    r = EXPECT(args, NULL, 0);
    CHECK(line_with(r.out, "ppl = ") != NULL);
    done(&r);
    free(text);
    remove(file);
    fx_free(&fx);
}

/* issue 10.5: NaN and infinity are refused at parse time, naming the option
 * (`--temp nan` passed `temp < 0` and failed later as a tokenizer error). */
/* issue 45.4: a bad value is named alone, with its range and meaning, not
 * buried in a list of every constraint the command has. */
TEST(cli_a_bad_option_value_names_that_option_alone) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    static const struct {
        const char *args, *named, *not_named;
    } bad[] = {
        {"generate -p hi -t 999", "-t 999", "--batch"},      {"generate -p hi -b 0", "-b 0", "-t "},
        {"generate -p hi -n -5", "-n -5", "--top-p"},        {"generate -p hi --temp -1", "--temp -1", "-n "},
        {"chat --top-p 2", "--top-p 2", "--temp"},           {"generate -p hi --ctx -3", "--ctx -3", "--batch"},
        {"serve --port 99999", "--port 99999", "--parallel"}, {"serve --parallel 0", "--parallel 0", "--port"},
        {"perplexity -f x --chunks -1", "--chunks -1", "--ctx"},
        {"bench model -p 1,x", "-p '1,x'", "-r"},            {"price --bandwidth -3", "--bandwidth -3", "--ctx"},
        {"verify -n 5000", "-n 5000", "--tol"},              {"demo -l 0", "-l 0", "prompt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[1024];
        if (!strncmp(bad[i].args, "demo", 4)) snprintf(args, sizeof args, "%s", bad[i].args); /* no model */
        else snprintf(args, sizeof args, "%s -m %s", bad[i].args, path);
        result r = EXPECT(args, NULL, 2);
        if (!strstr(r.err, bad[i].named) || strstr(r.err, bad[i].not_named) || strchr(r.err, '\n') != strrchr(r.err, '\n'))
            test_fail(__FILE__, __LINE__, "`%s` should name %s alone in one line: %s", args, bad[i].named, r.err);
        done(&r);
    }
    /* an unreadable prompt file says why */
    char args[1024];
    snprintf(args, sizeof args, "generate -m %s -f /nonexistent/prompt.txt", path);
    result r = EXPECT(args, NULL, 1);
    CHECK(strstr(r.err, "/nonexistent/prompt.txt") && strstr(r.err, "No such file or directory"));
    done(&r);
    /* -f - reads standard input: the same text as -p */
    snprintf(args, sizeof args, "generate -m %s -p 'hello there' -n 6 --temp 0", path);
    result p = EXPECT(args, NULL, 0);
    snprintf(args, sizeof args, "generate -m %s -f - -n 6 --temp 0", path);
    r = EXPECT(args, "hello there", 0);
    CHECK(strcmp(r.out, p.out) == 0);
    done(&r), done(&p);
    /* a context past the trained length (the fixture's is 1024) runs with a warning */
    snprintf(args, sizeof args, "generate -m %s -p hi -n 1 --temp 0 --ctx 2048", path);
    r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.err, "warning: a context of 2048 positions (--ctx)") && strstr(r.err, "than the 1024 "));
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p hi -n 1 --temp 0 --ctx 1024", path);
    r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.err, "warning") == NULL);
    done(&r);
    fx_free(&fx);
}

TEST(cli_version_prints_the_release) {
    result r = EXPECT("--version", NULL, 0);
    CHECK(strncmp(r.out, "kvcache ", 8) == 0 && r.out[8] >= '0' && r.out[8] <= '9');
    done(&r);
}

TEST(cli_numeric_options_refuse_nan_and_infinity_by_name) {
    const char *bad[] = {"generate -p hi --temp nan", "generate -p hi --temp inf", "generate -p hi --top-p nan",
                         "chat --temp -inf", "verify --tol nan", "price --preset llama-3.1-8b --bandwidth inf",
                         "price --preset llama-3.1-8b --weight-bits nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        result r = EXPECT(bad[i], NULL, 2);
        const char *opt = NULL; /* the last option names the bad value */
        for (const char *q = strstr(bad[i], " --"); q; q = strstr(q + 1, " --")) opt = q;
        char name[32] = "";
        if (opt) sscanf(opt + 1, "%31s", name);
        if (!strstr(r.err, name) || !strstr(r.err, "finite"))
            test_fail(__FILE__, __LINE__, "`%s` does not refuse a non-finite %s: %s", bad[i], name, r.err);
        done(&r);
    }
}

/* issue 10.5, second half: -t above the core count runs that many threads
 * and says so; above the engine's 256 it is refused (it was clamped silently). */
TEST(cli_more_threads_than_cores_is_allowed_with_a_warning) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char args[512];
    snprintf(args, sizeof args, "generate -m %s -p hi -n 2 --temp 0 -t %ld", path, cores + 3);
    result r = EXPECT(args, NULL, 0);
    char want[64];
    snprintf(want, sizeof want, "%ld threads", cores + 3);
    CHECK(strstr(r.err, "warning") && strstr(r.err, "cores"));
    CHECK(strstr(r.err, want) != NULL); /* runs with what was asked */
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p hi -n 2 -t 100000", path);
    r = EXPECT(args, NULL, 2);
    CHECK(strstr(r.err, "-t") && strstr(r.err, "256"));
    done(&r);
    fx_free(&fx);
}

/* ---------------------------------------------------------------- cache policies (issue 14) */

TEST(cli_generate_with_context_shift_runs_past_the_context_and_says_so) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char args[512];
    snprintf(args, sizeof args, "generate -m %s -p 'hello there' -n 100 --temp 0 --ctx 16 --context-shift", path);
    result r = EXPECT(args, NULL, 0);
    const char *dec = strstr(r.err, "decode:  ");
    CHECK(dec && atoi(dec + 9) + 0 >= 1);
    /* 100 tokens in 16 positions: shifts, and no stop at a full context */
    if (dec && !strstr(dec, "stopped at token limit") && !strstr(dec, "stopped at end of turn"))
        test_fail(__FILE__, __LINE__, "not run to the end: %s", r.err);
    CHECK(strstr(r.err, "context full") == NULL);
    if (strstr(dec ? dec : "", "token limit")) CHECK(strstr(r.err, "context shift: ") != NULL);
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p hi --keep 4", path); /* --keep without --context-shift */
    r = EXPECT(args, NULL, 2);
    CHECK(strstr(r.err, "--keep goes with --context-shift") != NULL);
    done(&r);
    fx_free(&fx);
}

TEST(cli_chat_with_context_shift_holds_a_conversation_ten_times_its_context) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    /* 24 turns of ~14 prompt tokens, 6-token replies and an end marker:
     * about 600 positions through a context of 64 */
    char in[4096] = "";
    for (int i = 0; i < 24; i++) {
        char line[64];
        snprintf(line, sizeof line, "turn %d: tell me more about it\n", i);
        strcat(in, line);
    }
    char args[512];
    snprintf(args, sizeof args, "chat -m %s -n 6 --temp 0 --ctx 64 --context-shift", path);
    result r = EXPECT(args, in, 0);
    CHECK(strstr(r.err, "[turn 24: ") != NULL);
    CHECK(strstr(r.err, "[context shift: dropped ") != NULL);
    CHECK(strstr(r.err, "new conversation") == NULL);
    CHECK(strstr(r.err, "context full") == NULL);
    done(&r);
    /* without it, the same input starts over instead */
    snprintf(args, sizeof args, "chat -m %s -n 6 --temp 0 --ctx 64", path);
    r = EXPECT(args, in, 0);
    CHECK(strstr(r.err, "[turn 24: ") != NULL);
    CHECK(strstr(r.err, "starting a new conversation") != NULL);
    done(&r);
    fx_free(&fx);
}

TEST(cli_generate_session_file_round_trip_equals_a_cold_run_and_a_bad_file_changes_nothing) {
    fx_model fx, other;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char sess[128], args[2048], cold_args[1024];
    snprintf(sess, sizeof sess, "/tmp/kvcache_cli_session_%d", (int)getpid());
    remove(sess);
    const char *prompt = "the quick brown fox jumps over the lazy dog";
    snprintf(cold_args, sizeof cold_args, "generate -m %s -p '%s' -n 12 --temp 0", path, prompt);
    result cold = EXPECT(cold_args, NULL, 0);
    /* first run: no file yet, saved after */
    snprintf(args, sizeof args, "generate -m %s -p 'the quick brown fox' -n 5 --temp 0 --session %s", path, sess);
    result r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.err, "new file") && strstr(r.err, "saved"));
    done(&r);
    /* second run: the file's prompt part begins this prompt */
    snprintf(args, sizeof args, "%s --session %s", cold_args, sess);
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, cold.out) == 0);
    const char *st = strstr(r.err, "session: ");
    CHECK(st && atoi(st + 9) > 0 && strstr(st, "restored") && strstr(st, "prefilled"));
    done(&r);
    /* the same prompt again: all but the last token restored, and the prefill line
     * counts only the token prefilled, the restored ones apart (issue 45.5) */
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, cold.out) == 0);
    const char *pl = strstr(r.err, "prefill: ");
    CHECK(pl && atoi(pl + 9) == 1 && strstr(pl, "restored from the session"));
    done(&r);
    /* corrupt: refused with the reason, the same answer cold */
    FILE *f = fopen(sess, "r+b");
    if (f) fseek(f, 200, SEEK_SET), fputc(0x77, f), fclose(f);
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, cold.out) == 0);
    CHECK(strstr(r.err, "session not restored") && strstr(r.err, "goes on cold"));
    done(&r);
    /* truncated */
    if ((f = fopen(sess, "r+b"))) fclose(f), truncate(sess, 100);
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, cold.out) == 0);
    CHECK(strstr(r.err, "session not restored") != NULL);
    done(&r);
    /* another model's file */
    if (!fx_build(&(fx_spec){.type = GW_Q8_0, .seed = 78, .tied = 1}, &other)) {
        char oargs[1024];
        remove(sess);
        snprintf(oargs, sizeof oargs, "generate -m %s -p '%s' -n 2 --temp 0 --session %s", other.path, prompt, sess);
        result o = EXPECT(oargs, NULL, 0);
        done(&o);
        char *before = slurp(sess);
        r = EXPECT(args, NULL, 0);
        CHECK(strcmp(r.out, cold.out) == 0);
        CHECK(strstr(r.err, "another model") != NULL);
        /* the refused file is kept, byte for byte, unless the user asks (issue 45.5) */
        char *after = slurp(sess);
        CHECK(before && after && memcmp(before, after, 1 << 20) == 0);
        CHECK(strstr(r.err, "--session-overwrite") != NULL);
        free(before), free(after);
        done(&r);
        fx_free(&other);
    }
    /* another K/V type, saved over the refused file as asked */
    snprintf(args, sizeof args, "%s --session %s --kv-type q8 --session-overwrite", cold_args, sess);
    r = EXPECT(args, NULL, 0);
    done(&r);
    snprintf(args, sizeof args, "%s --session %s", cold_args, sess);
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, cold.out) == 0);
    CHECK(strstr(r.err, "K/V type q8") != NULL);
    done(&r);
    remove(sess);
    done(&cold);
    fx_free(&fx);
}

TEST(cli_generate_draft_lookup_prints_the_same_text_as_plain_greedy) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    const char *prompts[] = {"one two three four, one two three four, one two three four, one two",
                             "a quick zephyr blows vexing daft jim"};
    for (int i = 0; i < 2; i++) {
        char args[1024];
        snprintf(args, sizeof args, "generate -m %s -p '%s' -n 40 --temp 0", path, prompts[i]);
        result a = EXPECT(args, NULL, 0);
        snprintf(args, sizeof args, "generate -m %s -p '%s' -n 40 --temp 0 --draft-lookup 8", path, prompts[i]);
        result b = EXPECT(args, NULL, 0);
        CHECK(strcmp(a.out, b.out) == 0);
        const char *dl = strstr(b.err, "draft lookup: ");
        if (dl) CHECK(strstr(dl, "accepted") && strstr(dl, "forward passes"));
        done(&a), done(&b);
    }
    char args[512];
    snprintf(args, sizeof args, "generate -m %s -p hi --draft-lookup 65", path);
    result r = EXPECT(args, NULL, 2);
    CHECK(strstr(r.err, "--draft-lookup") != NULL);
    done(&r);
    fx_free(&fx);
}

TEST(cli_verify_passes_for_every_policy_and_refuses_an_unknown_one) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    const char *policies[] = {"full", "window --window 8", "shift --ctx 56", "lookup", "session"};
    const char *says[] = {"PASS", "policy window", "shifts; largest difference", "tokens equal plain greedy",
                          "tokens equal the uninterrupted run"};
    for (int i = 0; i < 5; i++) {
        char args[512];
        snprintf(args, sizeof args, "verify -m %s -n 40 -t 2 --policy %s", path, policies[i]);
        result r = EXPECT(args, NULL, 0);
        if (!strstr(r.out, "PASS") || !strstr(r.out, says[i]))
            test_fail(__FILE__, __LINE__, "`%s` did not pass: %s", args, r.out);
        done(&r);
    }
    /* shift with q8 K/V: its own tolerance, still PASS; with --tol 0 the
     * re-encoding shows */
    char args[512];
    snprintf(args, sizeof args, "verify -m %s -n 40 --policy shift --ctx 56 --kv-type q8", path);
    result r = EXPECT(args, NULL, 0);
    done(&r);
    snprintf(args, sizeof args, "verify -m %s -n 40 --policy shift --ctx 56 --kv-type q8 --tol 0", path);
    r = EXPECT(args, NULL, 1);
    CHECK(strstr(r.out, "FAIL") != NULL);
    done(&r);
    snprintf(args, sizeof args, "verify -m %s --policy sliding", path);
    r = EXPECT(args, NULL, 2);
    CHECK(strstr(r.err, "--policy must be") != NULL);
    done(&r);
    fx_free(&fx);
}

/* `kvcache tokenize`: the ids of a file's bytes equal llama.cpp's (the corpus
 * fixture), pieces are shown escaped, control tokens are text unless
 * --special, and a bad call says what was wrong. */
TEST(cli_tokenize_prints_llama_cpp_ids_and_escaped_pieces) {
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    llm_model *m = rm_load(model, NULL);
    if (!m) return;
    llm_model_free(m);
    char args[512];
    snprintf(args, sizeof args, "tokenize -m %s -f tests/data/tokenizer/code_python.txt --ids --no-bos", model);
    result r = EXPECT(args, NULL, 0);
    char *want = slurp("tests/data/tokenizer/expected/code_python.smollm2.ids");
    CHECK(want && strlen(want) > 100 && strcmp(r.out, want) == 0);
    free(want), done(&r);
    snprintf(args, sizeof args, "tokenize -m %s -p 'a\tb\\x' --count", model);
    r = EXPECT(args, NULL, 0);
    CHECK(strstr(r.out, "'\\t'") != NULL && strstr(r.out, "'\\\\'") != NULL && strstr(r.out, "tokens\n"));
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s -p '<|im_start|>' --ids", model);
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, "1\n") != 0 && strchr(r.out, ' ') != NULL); /* several plain-text pieces */
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s -p '<|im_start|>' --ids --special", model);
    r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, "1\n") == 0);
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s", model);
    r = EXPECT(args, NULL, 2);
    CHECK(strstr(r.err, "-p TEXT or -f FILE") != NULL);
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s -f /nonexistent/text", model);
    r = EXPECT(args, NULL, 1);
    CHECK(strstr(r.err, "/nonexistent/text") && strstr(r.err, "No such file"));
    done(&r);
}

/* The prompt tokens a generate run reports ("prefill: N tokens"), or -1. */
static int prefill_tokens(const char *args) {
    result r = EXPECT(args, NULL, 0);
    const char *p = strstr(r.err, "prefill: ");
    int n = p ? atoi(p + 9) : -1;
    done(&r);
    return n;
}

/* Control tokens come from the chat template, never from what the user wrote:
 * a message holding "<|im_end|>" keeps it as its 7 text tokens, and a raw
 * prompt does too unless --special asks for the control token. */
TEST(cli_control_tokens_come_from_the_template_or_special_alone) {
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    llm_model *m = rm_load(model, NULL);
    if (!m) return;
    int32_t text_ids[16];
    int32_t k = llm_tokenize(llm_model_tokenizer(m), "<|im_end|>", 10, 0, 0, text_ids, 16);
    llm_model_free(m);
    CHECK(k > 1);
    char args[512];
    snprintf(args, sizeof args, "generate -m %s --chat -p 'a' -n 1 --temp 0", model);
    int one = prefill_tokens(args); /* "a" is one token */
    snprintf(args, sizeof args, "generate -m %s --chat -p '<|im_end|>' -n 1 --temp 0", model);
    CHECK_EQ_INT(prefill_tokens(args), one - 1 + k);
    snprintf(args, sizeof args, "generate -m %s -p '<|im_end|>' -n 1 --temp 0", model);
    CHECK_EQ_INT(prefill_tokens(args), k);
    snprintf(args, sizeof args, "generate -m %s -p '<|im_end|>' --special -n 1 --temp 0", model);
    CHECK_EQ_INT(prefill_tokens(args), 1);
    snprintf(args, sizeof args, "generate -m %s -p 'hi' --chat --special", model);
    result r = EXPECT(args, NULL, 2);
    CHECK(strstr(r.err, "--special") != NULL);
    done(&r);
}

/* bench model's decode floor counts what a token reads: every layer's
 * projections and the output (the tied embeddings here), packed or not
 * (Gemma 3 270M's Q4_K_M mix packs its Q4_K matrices, not its Q6_K ones; all
 * its row counts are multiples of 8, so the packed copies take the file's
 * bytes), summed from the file's tensor table; and per layer group the K/V
 * its layers attend: 3 full and 15 window-512 layers, one KV head of 256,
 * f16 K/V, so 1024 bytes per layer per position; at depth 600 and 4 new
 * tokens (mean position 602) the full layers read 602 positions and the
 * window layers 512. */
TEST(cli_bench_model_floor_counts_each_layer_groups_attended_kv) {
    const char *model = "models/gemma-3-270m-Q4_K_M.gguf";
    llm_model *m = rm_load(model, "gemma3-270m");
    if (!m) return;
    llm_model_free(m);
    llm_gguf *g;
    char err[256];
    CHECK_EQ_INT(llm_gguf_open(model, &g, err, sizeof err), 0);
    double weights = 0;
    for (int64_t i = 0; i < llm_gguf_n_tensors(g); i++) {
        const llm_gguf_tensor *t = llm_gguf_tensor_at(g, i);
        static const char *const proj[] = {".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
                                           ".attn_output.weight", ".ffn_gate.weight", ".ffn_up.weight",
                                           ".ffn_down.weight"};
        for (int k = 0; k < 7; k++)
            if (!strncmp(t->name, "blk.", 4) && strlen(t->name) > strlen(proj[k]) &&
                !strcmp(t->name + strlen(t->name) - strlen(proj[k]), proj[k]))
                weights += (double)t->n_bytes;
        if (!strcmp(t->name, "token_embd.weight")) weights += (double)t->n_bytes; /* tied: the output */
    }
    llm_gguf_close(g);
    char args[512];
    snprintf(args, sizeof args, "bench model -m %s -p 0 -n 4 --depth 600 -r 1 --kv-type f16 --json", model);
    result r = EXPECT(args, NULL, 0);
    double streamed = json_num(r.out, "streamed_bytes"), bytes = json_num(r.out, "bytes_per_token");
    CHECK(json_num(r.out, "packed_bytes") > 0 && json_num(r.out, "packed_bytes") <= streamed);
    CHECK_NEAR(streamed, weights, 0.5);
    CHECK_NEAR(bytes, weights + 3.0 * 1024 * 602 + 15.0 * 1024 * 512, 1.0);
    done(&r);
    /* every matrix of this file has a packed form: the mapped rows (KVCACHE_PACK=0) count the same */
    setenv("KVCACHE_PACK", "0", 1);
    r = EXPECT(args, NULL, 0);
    unsetenv("KVCACHE_PACK");
    CHECK(json_num(r.out, "packed_bytes") == 0);
    CHECK_NEAR(json_num(r.out, "streamed_bytes"), weights, 0.5);
    done(&r);
}

/* generate's and chat's penalties and --stop, on SmolLM2, whose
 * greedy continuation of "one two one two ..." repeats "two": each penalty
 * changes it, prompt lookup keeps a penalised text, a stop string cuts it,
 * and an out-of-range value is refused by name. */
TEST(cli_generate_and_chat_penalties_and_stop_strings) {
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    llm_model *m = rm_load(model, NULL);
    if (!m) return;
    llm_model_free(m);
    const char *base = "generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf -p 'one two one two one two one two' "
                       "-n 24 --temp 0 -t 2";
    char args[1024];
    result plain = EXPECT(base, NULL, 0);
    CHECK(strstr(plain.out, "two-two-two-two") != NULL);
    const char *opts[] = {"--frequency-penalty 2", "--presence-penalty 2", "--repeat-penalty 1.5",
                          "--repeat-penalty 1.5 --repeat-last-n -1"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        snprintf(args, sizeof args, "%s %s", base, opts[i]);
        result r = EXPECT(args, NULL, 0);
        if (!strcmp(r.out, plain.out)) test_fail(__FILE__, __LINE__, "%s changes nothing: %s", opts[i], r.out);
        if (i == 0) { /* the verify loop keeps the same history */
            snprintf(args, sizeof args, "%s %s --draft-lookup 8", base, opts[i]);
            result d = EXPECT(args, NULL, 0);
            CHECK(strcmp(d.out, r.out) == 0);
            done(&d);
        }
        done(&r);
    }
    /* all off: exactly the plain tokens */
    snprintf(args, sizeof args, "%s --repeat-penalty 1 --presence-penalty 0 --frequency-penalty 0 --min-p 0", base);
    result r = EXPECT(args, NULL, 0);
    CHECK(strcmp(r.out, plain.out) == 0);
    done(&r);
    /* --stop: the text before the first match, twice given */
    snprintf(args, sizeof args, "%s --stop -two-two- --stop zzz", base);
    r = EXPECT(args, NULL, 0);
    const char *at = strstr(plain.out, "-two-two-");
    CHECK(at && strlen(r.out) == (size_t)(at - plain.out) + 1 && !strncmp(r.out, plain.out, (size_t)(at - plain.out)));
    CHECK(strstr(r.err, "stop string") != NULL);
    done(&r);
    /* chat takes the same options */
    r = EXPECT("chat -m models/SmolLM2-135M-Instruct.Q4_1.gguf -n 30 --temp 0 -t 2", "Count: one two one two\n", 0);
    result c = EXPECT("chat -m models/SmolLM2-135M-Instruct.Q4_1.gguf -n 30 --temp 0 -t 2 --frequency-penalty 2 "
                      "--repeat-penalty 1.3 --min-p 0.05 --stop zzz", "Count: one two one two\n", 0);
    CHECK(strcmp(r.out, c.out) != 0);
    done(&r), done(&c);
    static const char *bad[][2] = {
        {"generate -p hi --presence-penalty 2.5", "--presence-penalty 2.5"},
        {"generate -p hi --frequency-penalty -3", "--frequency-penalty -3"},
        {"chat --min-p 1.5", "--min-p 1.5"},
        {"generate -p hi --repeat-penalty 0", "--repeat-penalty 0"},
        {"chat --repeat-last-n -2", "--repeat-last-n -2"},
        {"generate -p hi --stop ''", "--stop"},
        {"generate -p hi --stop a --stop b --stop c --stop d --stop e --stop f --stop g --stop h --stop i", "--stop"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s -m %s", bad[i][0], model);
        r = EXPECT(args, NULL, 2);
        if (!strstr(r.err, bad[i][1])) test_fail(__FILE__, __LINE__, "`%s` does not name %s: %s", args, bad[i][1], r.err);
        done(&r);
    }
    done(&plain);
}

/* --grammar and --json-schema hold the reply to a document (sampled, so
 * any token the grammar allows may come); a bad file is refused by name and
 * line, both options at once by usage. */
TEST(cli_generate_holds_the_reply_to_a_grammar_or_a_json_schema) {
    fx_model fx;
    const char *path = tiny_model(&fx);
    if (!path) return;
    char gfile[64], sfile[64], args[512];
    snprintf(gfile, sizeof gfile, "/tmp/kvcache_cli_%d.gbnf", (int)getpid());
    snprintf(sfile, sizeof sfile, "/tmp/kvcache_cli_%d.json", (int)getpid());
    FILE *f = fopen(gfile, "w");
    fputs("# three letters and a stop\nroot ::= \"x\" [a-c]{3} \".\"\n", f), fclose(f);
    f = fopen(sfile, "w");
    fputs("{\"enum\": [\"hello\", \"there\"]}", f), fclose(f);
    for (int seed = 1; seed <= 3; seed++) {
        snprintf(args, sizeof args, "generate -m %s -p hi -n 5 --temp 1.5 --seed %d --grammar %s", path, seed, gfile);
        result a = EXPECT(args, NULL, 0);
        size_t n = strlen(a.out);
        if (n && a.out[n - 1] == '\n') n--; /* the line the command ends its text with */
        for (size_t i = 0; i < n && i < 5; i++) /* a prefix of x[a-c]{3}. */
            if (i == 0 ? a.out[i] != 'x' : i < 4 ? !(a.out[i] >= 'a' && a.out[i] <= 'c') : a.out[i] != '.')
                test_fail(__FILE__, __LINE__, "seed %d: '%s' is not x[a-c]{3}.", seed, a.out);
        if (!(n >= 1 && n <= 5)) test_fail(__FILE__, __LINE__, "seed %d: '%s' (stderr %.800s)", seed, a.out, a.err);
        done(&a);
        snprintf(args, sizeof args, "generate -m %s -p hi -n 30 --temp 1.5 --seed %d --json-schema %s", path, seed, sfile);
        a = EXPECT(args, NULL, 0);
        char word[64] = "";
        size_t k = 0;
        for (const char *p = a.out; *p && k + 1 < sizeof word; p++)
            if (*p != ' ' && *p != '\n' && *p != '\t') word[k++] = *p;
        word[k] = 0;
        if (strncmp(word, "\"hello\"", k) && strncmp(word, "\"there\"", k))
            test_fail(__FILE__, __LINE__, "seed %d: '%s' is not the beginning of \"hello\" or \"there\"", seed, a.out);
        done(&a);
    }
    f = fopen(gfile, "w");
    fputs("root ::= a\n\na ::= b\n", f), fclose(f);
    snprintf(args, sizeof args, "generate -m %s -p hi -n 2 --grammar %s", path, gfile);
    result a = EXPECT(args, NULL, 1);
    CHECK(strstr(a.err, gfile) && strstr(a.err, "line 3") && strstr(a.err, "'b' is used but not defined"));
    done(&a);
    f = fopen(sfile, "w");
    fputs("{\"type\": \"string\", \"maxLength\": 3}", f), fclose(f);
    snprintf(args, sizeof args, "generate -m %s -p hi -n 2 --json-schema %s", path, sfile);
    a = EXPECT(args, NULL, 1);
    CHECK(strstr(a.err, "'maxLength' is not supported") != NULL);
    done(&a);
    snprintf(args, sizeof args, "generate -m %s -p hi -n 2 --json-schema %s --grammar %s", path, sfile, gfile);
    a = EXPECT(args, NULL, 2), done(&a);
    remove(gfile), remove(sfile);
    fx_free(&fx);
}
