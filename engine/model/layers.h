/* engine/model/layers.h - the layer toolkit architectures compose (engine/arch_NAME.c):
 * token embedding, RMSNorm (over rows or per head), matrix products over a
 * batch of rows (several sharing an input run as one pool job), RoPE at the
 * rows' positions, attention over the paged cache (or dense, for the
 * reference pass), the FFN activations, residual adds, and the final
 * projection onto the vocabulary for the wanted rows.
 *
 * Every piece works on `rows` rows of the pass's scratch (engine/model/arch.h) and
 * cuts its work into tasks of a fixed size, so results never depend on the
 * thread count. Internal to the engine. */
#ifndef LLM_LAYERS_H
#define LLM_LAYERS_H

#include "arch.h"
#include "../weights/quant.h"

/* ---- scratch */
int llm_scratch_alloc(llm_scratch *s, const llm_hparams *hp, int32_t rows); /* LLM_OK or LLM_ERR_NOMEM */
void llm_scratch_free(llm_scratch *s);

/* ---- matrix products: y = x W^T for m rows of x */

/* Up to three products run as one pool job (Q, K and V share an input; so
 * do gate and up). Run quantizes each distinct input once (the context's
 * act_bits, engine/weights/quant.h llm_act) before the job starts, into the pass's
 * scratch; products sharing an input share its quantized rows. */
/* The gated FFN activations */
typedef enum {
    LLM_GLU_SILU,       /* SwiGLU (Llama) */
    LLM_GLU_GELU_TANH,  /* GeGLU with the tanh form of gelu (Gemma) */
} llm_glu;

enum { LLM_MM_INPUTS = 3 };
typedef struct {
    struct {
        const llm_matrix *w;    /* [rows][cols] */
        const float *x;         /* [m][cols] */
        float *y;               /* [m][ldy] */
        int64_t ldy;            /* row stride of y (>= w->rows) */
        int32_t first_task;     /* index of this part's first task in the job (set by run) */
        int64_t task_rows;      /* rows of w each task computes (set by run) */
        int input;              /* index into act of this part's input (set by run) */
    } part[LLM_MM_INPUTS];
    int n_parts;
    int32_t m;                  /* rows of x */
    int glu;                    /* 1: parts 0 and 1 are a gate and its up (llm_mm_glu), their y
                                 * left as glu_act(gate) * up in part 0's */
    llm_glu glu_act;
    llm_act act[LLM_MM_INPUTS]; /* the distinct inputs, prepared by run */
} llm_mm_job;

/* A job over m rows; add 1-3 products, then run. */
llm_mm_job llm_mm_begin(int32_t m);
void llm_mm_add(llm_mm_job *j, const llm_matrix *w, const float *x, float *y, int64_t ldy);
void llm_mm_run(const llm_pass *ps, llm_mm_job *j);
/* One product: y [m][w->rows] = x [m][w->cols] W^T. */
void llm_matmul(const llm_pass *ps, const llm_matrix *w, const float *x, int32_t m, float *y);

/* ---- the blocks' projections */

/* ws->q, ws->k, ws->v = ws->h Wq, Wk, Wv for the pass's rows, one pool job,
 * plus the biases bq, bk, bv where the layer has them. */
void llm_project_qkv(const llm_pass *ps, const llm_layer_weights *w);

/* A job of one gated product: gate = act(x Wgate^T) * (x Wup^T), both
 * [m][rows]. Each task takes the same rows of both matrices and applies act
 * to them, so the activation runs on every thread, with no pass of its own. */
llm_mm_job llm_mm_glu(int32_t m, const llm_matrix *w_gate, const llm_matrix *w_up, const float *x, float *gate,
                      float *up, llm_glu act);

/* The gated feed-forward: ws->h = (act(ws->h Wgate) * (ws->h Wup)) Wdown for
 * the pass's rows (ws->gate and ws->up are its work). */
void llm_ffn(const llm_pass *ps, const llm_layer_weights *w, llm_glu act);

/* ---- element-wise */

/* x [rows][D] = token_embd rows of tokens [rows], decoded. */
void llm_embed(const llm_model *m, const int32_t *tokens, int32_t rows, float *x);
/* out = x / sqrt(mean(x^2) + eps) * w per row of n (out may be x). */
void llm_rmsnorm(const float *x, const float *w, float *out, int32_t rows, int64_t n, float eps);
/* The same per head, in place: x [rows][n_heads][d], w [d] (q/k norms). */
void llm_rmsnorm_heads(float *x, const float *w, int32_t rows, int32_t n_heads, int32_t d, float eps);
/* x += y over n. */
void llm_add_into(float *x, const float *y, size_t n);
/* x [rows][n] += b [n] on every row. */
void llm_add_rows(float *x, const float *b, int32_t rows, int64_t n);
/* x *= s over n. */
void llm_scale(float *x, size_t n, float s);

/* ---- attention */

/* Rotates ws->q (H heads) and ws->k (Hkv heads) at ws->pos by rope. */
int llm_rope_qk(const llm_pass *ps, const kv_rope *rope);
/* Layer l's attention of ws->q over ws->k / ws->v into ws->att: with a cache,
 * appends k and v to the layer's cache (m->lhp[l]: group, group_layer) and
 * attends over it; without one, dense causal attention among the rows. The
 * layer's window and scale apply either way. */
int llm_attention(const llm_pass *ps, int32_t l);

/* ---- output */

/* The wanted rows of ws->x (ws->out_rows[0..n_out)): norm by out_norm,
 * project by m->output into ps->logits [n_out][V]. Nothing when n_out is 0
 * or logits NULL. Clobbers ws->h. */
void llm_logits(const llm_pass *ps, const float *out_norm);

#endif
