"""Text generation from a GGUF model over include/kvengine.h.

    m = kvcache.Model("models/SmolLM2-135M-Instruct.Q4_1.gguf", ctx=2048, threads=4)
    m.generate("The capital of France is", max_tokens=16, temperature=0)
    m.chat([{"role": "user", "content": "Hi"}])
    for piece in m.generate("Once upon a time", stream=True): print(piece, end="")
    m.create_chat_completion(messages=[...])      # an OpenAI-shaped dict

A Model owns one engine context: a KV pool for `parallel` sequences and one
scheduler thread. Every call submits a request to it; calls from several
Python threads run at once and batch together in that thread's forward
passes (ctypes lets go of the GIL while a call waits for output). Greedy
output is the same alone or batched, up to a rounding tie (kvengine.h)."""
import ctypes
import time
import uuid

from . import _engine
from ._ffi import Closing
from .errors import KVCacheError

_KV_TYPES = {"f32": 1, "f16": 2, "bf16": 3, "q8": 4}
_FINISH = {"eog": "stop", "string": "stop", "length": "length", "context": "length", "cancel": "stop"}


class EngineError(KVCacheError):
    """An engine call failed, or a request ended with an error (non-finite
    logits, a failed forward pass). `status` is the kve_status code,
    `message` what happened."""

    def __init__(self, status, message, call=""):
        RuntimeError.__init__(self, f"{call + ': ' if call else ''}{message} ({int(status)})")
        self.status, self.message, self.call = int(status), message, call


def _err(buf):
    return buf.value.decode(errors="replace")


class Completion:
    """What one request produced: text, token ids, why it stopped, usage,
    and (with top_logprobs) each token's log-probability and alternatives."""

    def __init__(self):
        self.text, self.tokens, self.logprobs, self.top = "", [], [], []
        self.stop, self.n_prompt, self.n_cached, self.n_generated = "none", 0, 0, 0

    @property
    def finish_reason(self):
        return _FINISH.get(self.stop, self.stop)


class _Request(Closing):
    """A submitted kve_request, freed (cancelled if it runs) by close(): at the
    end of its iterator, or when a stream that was never started is dropped."""

    def __init__(self, lib, handle):
        self._lib, self.handle = lib, handle

    def close(self):
        h, self.handle = self.handle, None
        if h:
            self._lib.kve_request_free(h)


class Model(Closing):
    """A GGUF model and a context to run it (see the module's docstring).

    path: the GGUF file; ctx: positions one request may hold (0: the model's
    training context, at most 4096); threads: threads of the forward pass (0:
    one per core); parallel: requests decoded together (more wait); batch:
    rows of one forward pass; kv_type: K/V storage (f32, f16, bf16, q8)."""

    def __init__(self, path, ctx=0, threads=0, parallel=8, batch=512, kv_type="f16"):
        self._lib = _engine.lib()
        self._model = self._ctx = None
        if kv_type not in _KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(_KV_TYPES)}, not {kv_type!r}")
        self.path = str(path)
        err = ctypes.create_string_buffer(512)
        m = ctypes.c_void_p()
        rc = self._lib.kve_model_load(self.path.encode(), ctypes.byref(m), err, len(err))
        if rc != 0:
            raise EngineError(rc, _err(err), "kve_model_load")
        self._model = m
        p = self._lib.kve_context_default_params()
        p.n_ctx, p.n_threads, p.n_seqs, p.n_batch, p.kv_type = int(ctx), int(threads), int(parallel), int(batch), \
            _KV_TYPES[kv_type]
        c = ctypes.c_void_p()
        rc = self._lib.kve_context_create(m, ctypes.byref(p), ctypes.byref(c), err, len(err))
        if rc != 0:
            self.close()
            raise EngineError(rc, _err(err), "kve_context_create")
        self._ctx = c
        got = self._lib.kve_context_get_params(c)
        self.n_ctx, self.threads, self.parallel = got.n_ctx, got.n_threads, got.n_seqs

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Ends running requests and frees the context and the model."""
        if getattr(self, "_ctx", None):
            self._lib.kve_context_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            self._lib.kve_model_free(self._model)
            self._model = None

    # ------------------------------------------------------------ text
    @property
    def n_vocab(self):
        return self._lib.kve_model_n_vocab(self._model)

    @property
    def name(self):
        return self._lib.kve_model_name(self._model).decode(errors="replace")

    def _sized(self, call, name, *args, ctype=ctypes.c_char):
        """Runs a kvengine call under its "out of room" rule: size, then fill."""
        size = ctypes.c_int32() if ctype is ctypes.c_int32 else ctypes.c_size_t()
        rc = call(*args, None, 0, ctypes.byref(size))
        if rc not in (0, _engine.KVE_ERR_SPACE):
            raise EngineError(rc, self._lib.kve_status_str(rc).decode(), name)
        buf = (ctype * (size.value + 1))()
        rc = call(*args, buf, size.value + 1, ctypes.byref(size))
        if rc != 0:
            raise EngineError(rc, self._lib.kve_status_str(rc).decode(), name)
        return buf, size.value

    def tokenize(self, text, add_special=True, special=False):
        """Token ids of text (str or bytes); add_special: BOS as the model asks;
        special: control tokens written in the text are read as such."""
        b = text.encode() if isinstance(text, str) else bytes(text)
        buf, n = self._sized(self._lib.kve_tokenize, "kve_tokenize", self._model, b, len(b), int(add_special),
                             int(special), ctype=ctypes.c_int32)
        return list(buf[:n])

    def detokenize(self, tokens, special=False):
        """The text of token ids (bytes that are not UTF-8 become U+FFFD)."""
        ids = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
        buf, n = self._sized(self._lib.kve_detokenize, "kve_detokenize", self._model, ids, len(tokens), int(special))
        return bytes(buf)[:n].decode(errors="replace")

    def _messages(self, messages):
        if not messages:
            raise ValueError("messages: give at least one {'role': ..., 'content': ...}")
        arr = (_engine.ChatMessage * len(messages))()
        keep = []
        for i, msg in enumerate(messages):
            role, content = msg.get("role"), msg.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise ValueError(f"messages[{i}] needs a str 'role' and a str 'content'")
            r, c = role.encode(), content.encode()
            keep += [r, c]
            arr[i].role, arr[i].content = r, c
        return arr, keep

    @staticmethod
    def _thinking(enable_thinking):
        """The template's enable_thinking switch as the C API takes it: None
        (the template's default) -1, False 0, True 1."""
        if enable_thinking is None:
            return -1
        if not isinstance(enable_thinking, bool):
            raise ValueError(f"enable_thinking must be None, True or False, not {enable_thinking!r}")
        return int(enable_thinking)

    def apply_chat_template(self, messages, add_assistant=True, enable_thinking=None):
        """The model's chat template applied to messages (dicts with role and
        content). enable_thinking: the template's switch (Qwen3's); False
        opens the assistant's turn with an empty think block. A template
        without the switch refuses True and False (EngineError)."""
        arr, _keep = self._messages(messages)
        buf, n = self._sized(self._lib.kve_chat_apply_ex, "kve_chat_apply_ex", self._model, arr, len(messages),
                             int(add_assistant), self._thinking(enable_thinking))
        return bytes(buf)[:n].decode(errors="replace")

    # ------------------------------------------------------------ requests
    def _submit(self, prompt=None, tokens=None, messages=None, max_tokens=128, temperature=0.8, top_k=40,
                top_p=0.95, min_p=0.0, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                random_state=1, stop=None, top_logprobs=-1, enable_thinking=None):
        if self._ctx is None:
            raise EngineError(-203, "the model is closed", "kve_submit")
        p = self._lib.kve_request_default_params()
        keep = []
        if prompt is not None:
            p.prompt = prompt.encode() if isinstance(prompt, str) else bytes(prompt)
        if tokens is not None:
            arr = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
            keep.append(arr)
            p.tokens, p.n_tokens = arr, len(tokens)
        if messages is not None:
            arr, k = self._messages(messages)
            keep += [arr, k]
            p.messages, p.n_messages = arr, len(messages)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if stops:
            sarr = (ctypes.c_char_p * len(stops))(*[s.encode() for s in stops])
            keep.append(sarr)
            p.stops, p.n_stops = sarr, len(stops)
        p.max_tokens = -1 if max_tokens is None else int(max_tokens)
        p.temperature, p.top_k, p.top_p, p.min_p = float(temperature), int(top_k), float(top_p), float(min_p)
        p.repeat_penalty, p.presence_penalty = float(repeat_penalty), float(presence_penalty)
        p.frequency_penalty = float(frequency_penalty)
        p.random_state = int(random_state) & ((1 << 64) - 1)
        p.top_logprobs = int(top_logprobs)
        p.enable_thinking = self._thinking(enable_thinking)
        err = ctypes.create_string_buffer(512)
        r = ctypes.c_void_p()
        rc = self._lib.kve_submit(self._ctx, ctypes.byref(p), ctypes.byref(r), err, len(err))
        if rc != 0:
            raise EngineError(rc, _err(err) or self._lib.kve_status_str(rc).decode(), "kve_submit")
        return r

    def _pieces(self, req, done):
        """Yields (text, tokens, logprobs, tops) as request req makes them;
        fills done (a Completion) with the totals; frees it at the end or on close."""
        out = _engine.Output()
        lib, r = self._lib, req.handle
        try:
            while True:
                rc = lib.kve_request_poll(r, 250, ctypes.byref(out))
                if rc not in (0, _engine.KVE_ERR_TIMEOUT):
                    raise EngineError(rc, lib.kve_status_str(rc).decode(), "kve_request_poll")
                text = ctypes.string_at(out.text, out.text_len).decode(errors="replace") if out.text_len else ""
                n = out.n_tokens
                toks = out.tokens[:n] if n else []
                lps = out.logprobs[:n] if n and out.logprobs else []
                w = out.n_top
                tops = [list(zip(out.top_ids[i * w:(i + 1) * w], out.top_logprobs[i * w:(i + 1) * w]))
                        for i in range(n)] if w else []
                done.n_prompt, done.n_cached, done.n_generated = out.n_prompt, out.n_cached, out.n_generated
                stop = _engine.STOP_NAMES[out.stop]
                if stop == "error":
                    raise EngineError(out.status, out.error.decode(errors="replace"), "generation")
                if text or toks:
                    done.text += text
                    done.tokens += toks
                    done.logprobs += lps
                    done.top += tops
                    yield text, toks, lps, tops
                if stop != "none":
                    done.stop = stop
                    return
        finally:
            req.close()

    def _run(self, stream, **kw):
        req = _Request(self._lib, self._submit(**kw))
        done = Completion()
        it = self._pieces(req, done)
        if stream:
            return it, done
        for _ in it:
            pass
        return None, done

    def complete(self, prompt=None, tokens=None, messages=None, **kw):
        """One request run to its end: a Completion (text, tokens, stop, usage,
        logprobs with top_logprobs >= 0). Keywords as generate's."""
        return self._run(False, prompt=prompt, tokens=tokens, messages=messages, **kw)[1]

    def generate(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.0,
                 repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, random_state=1, stop=None,
                 stream=False):
        """The continuation of prompt (str, or a list of token ids): the text,
        or with stream=True an iterator of text pieces as they are made.
        temperature <= 0 is greedy; stop: a string or a list of up to 8."""
        kw = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                  frequency_penalty=frequency_penalty, random_state=random_state, stop=stop)
        if isinstance(prompt, (list, tuple)):
            kw["tokens"] = list(prompt)
        else:
            kw["prompt"] = prompt
        it, done = self._run(stream, **kw)
        return (piece[0] for piece in it if piece[0]) if stream else done.text

    def chat(self, messages, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.0,
             repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, random_state=1, stop=None,
             stream=False, enable_thinking=None):
        """The assistant's reply to messages ([{'role': ..., 'content': ...}])
        under the model's chat template: its text, or with stream=True an
        iterator of text pieces. enable_thinking: as apply_chat_template."""
        it, done = self._run(stream, messages=messages, max_tokens=max_tokens, temperature=temperature,
                             top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                             presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                             random_state=random_state, stop=stop, enable_thinking=enable_thinking)
        return (piece[0] for piece in it if piece[0]) if stream else done.text

    # ------------------------------------------------------------ OpenAI-shaped
    def _openai_kw(self, max_tokens, temperature, top_p, top_k, min_p, stop, seed, presence_penalty,
                   frequency_penalty, repeat_penalty, top_logprobs):
        return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                    stop=stop, random_state=1 if seed is None else seed, presence_penalty=presence_penalty,
                    frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty, top_logprobs=top_logprobs)

    def _piece(self, token):
        return self.detokenize([token], special=True)

    def create_completion(self, prompt, max_tokens=16, temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                          stop=None, stream=False, seed=None, logprobs=None, presence_penalty=0.0,
                          frequency_penalty=0.0, repeat_penalty=1.0):
        """An OpenAI text_completion dict (llama-cpp-python's create_completion),
        or with stream=True an iterator of its chunks. logprobs: N
        alternatives per token (OpenAI's completions logprobs)."""
        kw = self._openai_kw(max_tokens, temperature, top_p, top_k, min_p, stop, seed, presence_penalty,
                             frequency_penalty, repeat_penalty, -1 if logprobs is None else int(logprobs))
        kw["tokens" if isinstance(prompt, (list, tuple)) else "prompt"] = prompt
        cid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())
        it, done = self._run(stream, **kw)

        def lp_block(toks, lps, tops):
            if logprobs is None:
                return None
            return {"tokens": [self._piece(t) for t in toks], "token_logprobs": list(lps),
                    "top_logprobs": [{self._piece(i): v for i, v in top} for top in tops], "text_offset": None}

        def choice(text, finish, lp):
            return {"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}

        def head(obj):
            return {"id": cid, "object": "text_completion", "created": created, "model": self.path, **obj}

        if stream:
            def chunks():
                for text, toks, lps, tops in it:
                    yield head({"choices": [choice(text, None, lp_block(toks, lps, tops))]})
                yield head({"choices": [choice("", done.finish_reason, None)]})
            return chunks()
        return head({"choices": [choice(done.text, done.finish_reason, lp_block(done.tokens, done.logprobs, done.top))],
                     "usage": self._usage(done)})

    def create_chat_completion(self, messages, max_tokens=None, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05,
                               stop=None, stream=False, seed=None, logprobs=False, top_logprobs=None,
                               presence_penalty=0.0, frequency_penalty=0.0, repeat_penalty=1.0, enable_thinking=None):
        """An OpenAI chat.completion dict (llama-cpp-python's
        create_chat_completion), or with stream=True an iterator of
        chat.completion.chunk dicts. logprobs=True (with top_logprobs: N
        alternatives) adds OpenAI's logprobs.content. enable_thinking: as
        apply_chat_template."""
        n_top = (int(top_logprobs or 0)) if logprobs else -1
        kw = self._openai_kw(max_tokens, temperature, top_p, top_k, min_p, stop, seed, presence_penalty,
                             frequency_penalty, repeat_penalty, n_top)
        cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        it, done = self._run(stream, messages=messages, enable_thinking=enable_thinking, **kw)

        def lp_block(toks, lps, tops):
            if not logprobs:
                return None
            content = []
            for k, (t, lp) in enumerate(zip(toks, lps)):
                alts = tops[k] if k < len(tops) else []
                content.append({"token": self._piece(t), "logprob": lp, "id": t,
                                "top_logprobs": [{"token": self._piece(i), "logprob": v, "id": i} for i, v in alts]})
            return {"content": content}

        def head(obj):
            return {"id": cid, "created": created, "model": self.path, **obj}

        if stream:
            def chunks():
                yield head({"object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]})
                for text, toks, lps, tops in it:
                    yield head({"object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": {"content": text}, "logprobs": lp_block(toks, lps, tops),
                         "finish_reason": None}]})
                yield head({"object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {}, "logprobs": None, "finish_reason": done.finish_reason}]})
            return chunks()
        return head({"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": done.text},
             "logprobs": lp_block(done.tokens, done.logprobs, done.top), "finish_reason": done.finish_reason}],
            "usage": self._usage(done)})

    @staticmethod
    def _usage(done):
        return {"prompt_tokens": done.n_prompt, "completion_tokens": done.n_generated,
                "total_tokens": done.n_prompt + done.n_generated}


__all__ = ["Model", "EngineError", "Completion"]
