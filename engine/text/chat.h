/* engine/text/chat.h - chat prompt formats: render a conversation as the text a
 * chat model was trained on, without a Jinja interpreter.
 *
 * A model's GGUF carries its Jinja template in `tokenizer.chat_template`; we
 * recognise the family by its markers and render it in C:
 *
 *   CHATML  <|im_start|>role\ncontent<|im_end|>\n ...  then <|im_start|>assistant\n
 *           (SmolLM2-Instruct, Qwen). A default system message the template
 *           inserts when the conversation has none (SmolLM2: "You are a helpful
 *           AI assistant named SmolLM, trained by Hugging Face") is read out of
 *           the template text. Qwen3's template takes enable_thinking: false
 *           ends the generation prompt with an empty think block
 *           "<think>\n\n</think>\n\n" (llm_chat_set_thinking).
 *   LLAMA3  <|start_header_id|>role<|end_header_id|>\n\ntrimmed content<|eot_id|>
 *           then <|start_header_id|>assistant<|end_header_id|>\n\n
 *   LLAMA2  [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...
 *   ZEPHYR  <|role|>\ncontent</s>\n ... then <|assistant|>\n (TinyLlama-Chat)
 *   GEMMA   <start_of_turn>user\ntrimmed content<end_of_turn>\n ... then
 *           <start_of_turn>model\n (Gemma 2 and 3; "assistant" is written "model",
 *           a system message is folded into the first user turn as
 *           "system\n\nuser"). Chosen too for a file with no template whose
 *           vocabulary has <start_of_turn> (the pre-trained Gemma 3 files).
 *
 * The text never starts with the BOS token: tokenize the first chunk of a
 * conversation with add_special set and the tokenizer adds it (Llama 2's later
 * turns do write "<s>", so tokenize with parse_special set). Llama 3.1+
 * templates add a dated system preamble and tool blocks; only the plain
 * Llama 3 turn format is rendered.
 *
 * Every render function writes NUL-terminated text and returns its length;
 * -(length + 1) when cap is too small (nothing written); LLM_CHAT_ERR for a
 * bad argument. */
#ifndef LLM_CHAT_H
#define LLM_CHAT_H

#include <stdint.h>

#include "tokenizer.h"

#define LLM_CHAT_ERR INT32_MIN

typedef enum {
    LLM_CHAT_UNKNOWN = 0,
    LLM_CHAT_CHATML,
    LLM_CHAT_LLAMA3,
    LLM_CHAT_LLAMA2,
    LLM_CHAT_ZEPHYR,
    LLM_CHAT_GEMMA,
} llm_chat_kind;

/* One message of a conversation. */
typedef struct {
    const char *role;    /* "system", "user", "assistant"; ChatML and Llama 3 write any role
                          * name, Llama 2 and Zephyr skip other roles as their templates do */
    const char *content; /* NUL-terminated text */
} llm_chat_msg;

/* How to render: the family and the few strings a template takes from
 * elsewhere. Plain data; copy it freely. */
typedef struct {
    llm_chat_kind kind;
    char default_system[1024]; /* system message written when the first message is not one;
                                * "" for none */
    char bos[32];              /* BOS text for formats that write it mid-conversation (Llama 2) */
    char eos[32];              /* EOS text for formats that end turns with it (Llama 2, Zephyr) */
    int think_switch;          /* the template takes enable_thinking (Qwen3) */
    int no_think;              /* enable_thinking false: the generation prompt ends with an
                                * empty think block (set by llm_chat_set_thinking) */
} llm_chat_format;

/* The format of a family with no default system message, bos "<s>", eos "</s>". */
llm_chat_format llm_chat_format_of(llm_chat_kind kind);

/* Recognise the format from tokenizer.chat_template text (NULL allowed).
 * bos_text/eos_text: the tokenizer's BOS/EOS token texts, NULL for "<s>" and
 * "</s>". Returns 0, or -1 with out->kind = LLM_CHAT_UNKNOWN when no family
 * matches. */
int llm_chat_format_from_template(const char *tmpl, const char *bos_text, const char *eos_text,
                                  llm_chat_format *out);

/* The template's enable_thinking: 0 renders the generation prompt as the
 * template does with enable_thinking=false, 1 as with true (its default).
 * Returns 0, or -1 with f unchanged when the template has no such switch:
 * a model that cannot be asked not to think is not told it was. */
int llm_chat_set_thinking(llm_chat_format *f, int enable);

/* For a model without a template: guess the family from the control tokens
 * its vocabulary has (<|im_start|>, <|start_header_id|>, <|user|>,
 * <start_of_turn>). Returns 0,
 * or -1 with out->kind = LLM_CHAT_UNKNOWN. */
int llm_chat_format_from_vocab(const llm_tokenizer *tok, llm_chat_format *out);

/* The whole conversation msgs[0..n_msgs); add_generation_prompt: end with the
 * header that makes the model answer as the assistant. */
int32_t llm_chat_render(const llm_chat_format *fmt, const llm_chat_msg *msgs, int32_t n_msgs,
                        int add_generation_prompt, char *out, int32_t cap);

/* Only what follows msgs[0..n_prev) for a chat loop that keeps its cache: the
 * cache holds the rendering of msgs[0..n_prev) up to and including the end-of-
 * turn marker of its last message (llm_chat_turn_end: for a reply the model
 * generated, feed the stop token it produced, or this marker, into the cache).
 * With n_prev = 0 this is llm_chat_render. */
int32_t llm_chat_render_continuation(const llm_chat_format *fmt, const llm_chat_msg *msgs,
                                     int32_t n_msgs, int32_t n_prev, int add_generation_prompt,
                                     char *out, int32_t cap);

/* The conversation as token ids for tok, in *out (malloc'ed; the caller
 * frees it): the ids of llm_chat_render's text tokenized with parse_special,
 * except that only the template's own markers (turn and header delimiters,
 * BOS and EOS text) become control tokens. Text the messages bring, content
 * and role names, is tokenized as text whatever it holds, so a message that
 * writes "<|im_end|>" cannot end its turn or open another. add_special: BOS
 * (and EOS) as the tokenizer adds them. Returns the number of ids, or
 * LLM_CHAT_ERR for a bad argument or when out of memory. */
int32_t llm_chat_tokenize(const llm_chat_format *fmt, const llm_tokenizer *tok, const llm_chat_msg *msgs,
                          int32_t n_msgs, int add_generation_prompt, int add_special, int32_t **out);

/* llm_chat_tokenize for the part after the first n_prev messages, as
 * llm_chat_render_continuation renders it: what a cache holding those needs
 * next. n_prev = 0 is llm_chat_tokenize. */
int32_t llm_chat_tokenize_continuation(const llm_chat_format *fmt, const llm_tokenizer *tok,
                                       const llm_chat_msg *msgs, int32_t n_msgs, int32_t n_prev,
                                       int add_generation_prompt, int add_special, int32_t **out);

/* The text that ends a turn: "<|im_end|>", "<|eot_id|>", "<end_of_turn>", or the
 * format's eos. */
const char *llm_chat_turn_end(const llm_chat_format *fmt);

#endif
