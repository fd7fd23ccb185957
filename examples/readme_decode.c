#include <stdio.h>
#include <stdlib.h>
#include "kvcache.h"

int main(void) {  /* one layer, 8 query heads over 2 KV heads, head_dim 16 */
    enum { D = 64, H = 8, HKV = 2, HD = 16, PROMPT = 5, STEPS = 8 };
    kv_cache_params p = kv_cache_default_params();
    p.n_kv_heads = HKV, p.head_dim = HD, p.dtype = KV_F16;
    kv_cache *cache;
    int32_t seq, rows[2] = {0, PROMPT};
    if (kv_cache_create(&p, &cache) || kv_seq_new(cache, &seq)) return 1;
    static float wq[D * H * HD], wk[D * HKV * HD], wv[D * HKV * HD], x[PROMPT * D], out[PROMPT * H * HD];
    static float scratch[PROMPT * (H + 2 * HKV) * HD];
    for (int i = 0; i < D * HKV * HD; i++) wk[i] = wv[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < D * H * HD; i++) wq[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < PROMPT * D; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    kv_layer layer = {.dim = D, .n_heads = H, .wq = wq, .wk = wk, .wv = wv};
    kv_batch batch = {.n_seqs = 1, .seqs = &seq, .row_start = rows};
    for (int step = 0; step <= STEPS; step++) {   /* step 0: prefill; then decode */
        rows[1] = step == 0 ? PROMPT : 1;          /* new tokens only */
        int rc = kv_seq_reserve(cache, seq, rows[1], NULL);
        if (!rc) rc = kv_step_f32(cache, &layer, &batch, x, out, scratch);
        if (rc) { fprintf(stderr, "kvcache: %s\n", kv_status_str(rc)); return 1; }
        for (int i = 0; i < D; i++) x[i] = out[(rows[1] - 1) * H * HD + i];  /* feed back */
    }
    printf("cached %d tokens, %llu KV bytes each\n", kv_seq_length(cache, seq),
           (unsigned long long)kv_cache_get_stats(cache).bytes_per_token);
    kv_cache_free(cache);
    return 0;
}
