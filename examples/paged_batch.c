/* examples/paged_batch.c - a ragged batch on the paged cache.
 *
 * Three sequences of different lengths share one kv_batch each round: A
 * prefills its 20-token prompt in chunks of 8 while B and C, whose prompts are
 * short, already decode one token a round. A round reserves room for every
 * sequence at once (kv_batch_reserve, all or nothing), then runs each of two
 * layers over all the rows (kv_step_f32). The batch is CSR: sequence b owns
 * rows row_start[b] .. row_start[b+1]-1, and its row i sits at absolute
 * position S_b - T_b + i.
 *
 * At the end every sequence is recomputed alone, all its tokens in one pass
 * through a fresh cache: the outputs must agree to FP32 rounding. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvcache.h"

enum { D = 64, H = 8, HKV = 2, HD = 8, LAYERS = 2, NSEQ = 3, CHUNK = 8, ROUNDS = 6, MAXROWS = 32 };

static const char *names[NSEQ] = {"A", "B", "C"};
static const int prompt[NSEQ] = {20, 5, 3};

static float wq[LAYERS][D * H * HD], wk[LAYERS][D * HKV * HD], wv[LAYERS][D * HKV * HD];
static float result[NSEQ][MAXROWS][D]; /* last layer's output of each token of each sequence */

/* The input of token `pos` of sequence `s`: any fixed function will do. */
static void embed(int s, int pos, float *x) {
    for (int i = 0; i < D; i++) x[i] = 0.5f * sinf(0.37f * (float)i + 1.3f * (float)pos + 2.1f * (float)s);
}

static kv_cache *make_cache(int32_t max_seqs) {
    kv_cache_params p = kv_cache_default_params();
    p.n_layers = LAYERS, p.n_kv_heads = HKV, p.head_dim = HD, p.dtype = KV_F32;
    p.page_size = 4, p.n_pages = 64, p.max_seqs = max_seqs;
    kv_cache *c = NULL;
    int rc = kv_cache_create(&p, &c);
    if (rc) fprintf(stderr, "paged_batch: kv_cache_create: %s\n", kv_status_str(rc));
    return c;
}

/* Every layer over the batch's rows: x [rows, D] in, out [rows, D] (H * HD = D). */
static int run_layers(kv_cache *c, const kv_rope *rope, const kv_batch *b, float *x, float *out) {
    static float scratch[MAXROWS * (H + 2 * HKV) * HD];
    for (int l = 0; l < LAYERS; l++) {
        kv_layer layer = {.layer = l, .dim = D, .n_heads = H, .wq = wq[l], .wk = wk[l], .wv = wv[l], .rope = rope};
        int rc = kv_step_f32(c, &layer, b, x, out, scratch);
        if (rc) return rc;
        memcpy(x, out, sizeof(float) * (size_t)b->row_start[b->n_seqs] * D);
    }
    return KV_OK;
}

int main(void) {
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < D * H * HD; i++) wq[l][i] = 0.1f * sinf(0.7f * (float)i + (float)l);
        for (int i = 0; i < D * HKV * HD; i++) wk[l][i] = 0.1f * cosf(0.3f * (float)i + (float)l);
        for (int i = 0; i < D * HKV * HD; i++) wv[l][i] = 0.1f * sinf(1.1f * (float)i - (float)l);
    }
    kv_rope rope;
    kv_rope_params rp = kv_rope_default_params(HD);
    kv_cache *cache = make_cache(NSEQ);
    if (!cache || kv_rope_init(&rope, &rp)) return 1;

    int32_t seqs[NSEQ], done[NSEQ] = {0};
    for (int s = 0; s < NSEQ; s++)
        if (kv_seq_new(cache, &seqs[s])) return 1;

    static float x[MAXROWS * D], out[MAXROWS * D];
    for (int round = 0; round < ROUNDS; round++) {
        /* this round's rows: a chunk of the prompt while one is left, else one token */
        int32_t row_start[NSEQ + 1] = {0};
        for (int s = 0; s < NSEQ; s++) {
            int left = prompt[s] - done[s], T = left > 0 ? (left < CHUNK ? left : CHUNK) : 1;
            row_start[s + 1] = row_start[s] + T;
            for (int i = 0; i < T; i++) embed(s, done[s] + i, x + (size_t)(row_start[s] + i) * D);
        }
        kv_batch batch = {.n_seqs = NSEQ, .seqs = seqs, .row_start = row_start};
        int rc = kv_batch_reserve(cache, &batch, NULL);
        if (!rc) rc = run_layers(cache, &rope, &batch, x, out);
        if (rc) {
            fprintf(stderr, "paged_batch: round %d: %s\n", round, kv_status_str(rc));
            return 1;
        }
        printf("round %d:", round);
        for (int s = 0; s < NSEQ; s++) {
            int T = row_start[s + 1] - row_start[s];
            memcpy(result[s][done[s]], out + (size_t)row_start[s] * D, sizeof(float) * (size_t)T * D);
            done[s] += T;
            printf("  %s %s T=%d S=%d", names[s], done[s] <= prompt[s] ? "prefill" : "decode ", T,
                   kv_seq_length(cache, seqs[s]));
        }
        printf("\n");
    }
    kv_cache_stats st = kv_cache_get_stats(cache);
    printf("pages used %d of %d, %llu bytes per token\n", st.pages_used, st.pages_total,
           (unsigned long long)st.bytes_per_token);

    /* Each sequence alone, in one pass: the same numbers. */
    double worst = 0;
    for (int s = 0; s < NSEQ; s++) {
        kv_cache *alone = make_cache(1);
        int32_t seq, rows[2] = {0, done[s]};
        if (!alone || kv_seq_new(alone, &seq) || kv_seq_reserve(alone, seq, done[s], NULL)) return 1;
        for (int i = 0; i < done[s]; i++) embed(s, i, x + (size_t)i * D);
        kv_batch one = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
        if (run_layers(alone, &rope, &one, x, out)) return 1;
        for (int i = 0; i < done[s] * D; i++) worst = fmax(worst, fabs(out[i] - result[s][i / D][i % D]));
        kv_cache_free(alone);
    }
    printf("batched and chunked vs one pass per sequence: max difference %.2e\n", worst);
    kv_cache_free(cache);
    return worst < 1e-5 ? 0 : 1;
}
