#include <stdio.h>
#include "kvengine.h"

/* Loads a GGUF model and answers one chat message, greedy, the text printed
 * as it comes: ./readme_generate [MODEL.gguf] */
int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    char err[256];
    kve_model *m;
    if (kve_model_load(path, &m, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 1;
    }
    kve_context_params cp = kve_context_default_params();
    cp.n_ctx = 512, cp.n_seqs = 2;
    kve_context *c;
    if (kve_context_create(m, &cp, &c, err, sizeof err) != KVE_OK) {
        fprintf(stderr, "context: %s\n", err);
        kve_model_free(m);
        return 1;
    }
    kve_chat_message msgs[] = {{"user", "What is the capital of France?"}};
    kve_request_params rp = kve_request_default_params();
    rp.messages = msgs, rp.n_messages = 1;
    rp.temperature = 0, rp.max_tokens = 24;
    kve_request *r;
    int rc = kve_submit(c, &rp, &r, err, sizeof err);
    if (rc != KVE_OK) {
        fprintf(stderr, "submit: %s (%s)\n", err, kve_status_str(rc));
    } else {
        kve_output o;
        while ((rc = kve_request_poll(r, -1, &o)) == KVE_OK) {
            fwrite(o.text, 1, o.text_len, stdout);
            if (o.stop != KVE_STOP_NONE) break;
        }
        printf("\n[%s: %d prompt tokens, %d generated]\n", kve_stop_reason_str(o.stop), (int)o.n_prompt,
               (int)o.n_generated);
        if (o.stop == KVE_STOP_ERROR) fprintf(stderr, "error: %s\n", o.error), rc = 1;
        kve_request_free(r);
    }
    kve_context_free(c);
    kve_model_free(m);
    return rc == KVE_OK ? 0 : 1;
}
