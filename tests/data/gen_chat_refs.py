#!/usr/bin/env python3
"""Reference renderings for tests/test_chat.c, made by running the models' own
Jinja chat templates with jinja2 the way HF transformers does (trim_blocks,
lstrip_blocks).

    pip install jinja2
    python3 tests/data/gen_chat_refs.py      # writes tests/data/chat_cases.txt

The templates below are the `chat_template` strings the models ship (SmolLM2's
as its GGUF stores it). Lines of chat_cases.txt, all text hex-encoded UTF-8:

  T <name> <template>                 a template
  M <conversation> <role> <content>   the messages of each conversation, in order
  R <name> <conversation> <k> <gen> <rendering of the first k messages>

A rendering never starts with BOS: our renderer leaves the first BOS to the
tokenizer, so the templates run with bos_token "" (Gemma's writes it first) except Llama 2, which writes
BOS before every user turn; its leading "<s>" is removed instead.
"""
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
           "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
           "{% endif %}")
# Qwen2-Instruct, with its escapes written "\\n" as tokenizer_config.json has them.
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim"
          " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
          "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
          "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
          "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
          "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
TINYLLAMA = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
             "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
             "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
             "{% elif message['role'] == 'assistant' %}\n"
             "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
             "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
             "{% endfor %}")

# Gemma 3 instruction-tuned (google/gemma-3-270m-it and the larger ones).
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# Qwen3 (Qwen/Qwen3-0.6B and the larger ones), with its escapes written "\\n"
# as tokenizer_config.json has them. Its enable_thinking switch is rendered
# three ways: absent (qwen3), true (qwen3_think), false (qwen3_nothink).
QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
# The switch's value for each rendering of QWEN3 (None: not passed).
THINKING = {"qwen3": None, "qwen3_think": True, "qwen3_nothink": False}

TEMPLATES = [("smollm2", SMOLLM2), ("qwen2", QWEN2), ("chatml", CHATML), ("llama3", LLAMA3),
             ("llama2", LLAMA2), ("tinyllama", TINYLLAMA), ("gemma3", GEMMA3),
             ("qwen3", QWEN3), ("qwen3_think", QWEN3), ("qwen3_nothink", QWEN3)]

CONVERSATIONS = [
    [("user", "Hello!")],
    [("system", "You are terse."), ("user", "What is 2+2?")],
    [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")],
    [("system", "  Be kind.  "), ("user", "  padded question \n"), ("assistant", " padded answer\n\n"),
     ("user", "Ünïcödé 你好 😀"), ("assistant", "Sure.")],
    [("user", "line one\nline two\n"), ("assistant", "ok"), ("user", "   ")],
]


def hexs(s):
    return s.encode("utf-8").hex() or "-"


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(HERE, "chat_cases.txt"), "w") as f:
        f.write("# generated by gen_chat_refs.py; fields are hex-encoded UTF-8\n")
        for name, tmpl in TEMPLATES:
            f.write("T %s %s\n" % (name, hexs(tmpl)))
        for ci, conv in enumerate(CONVERSATIONS):
            for role, content in conv:
                f.write("M %d %s %s\n" % (ci, hexs(role), hexs(content)))
        for name, tmpl in TEMPLATES:
            t = env.from_string(tmpl)
            for ci, conv in enumerate(CONVERSATIONS):
                for k in range(len(conv) + 1):
                    for gen in (0, 1):
                        msgs = [{"role": r, "content": c} for r, c in conv[:k]]
                        if name in ("llama2", "gemma3") and (k == 0 or (k == 1 and conv[0][0] == "system")):
                            continue  # the template reads messages[0]
                        if name in THINKING and (k == 0 or conv[k - 1][0] == "assistant"):
                            continue  # messages[0]; a last assistant turn gets a think block (not rendered)
                        bos = "<s>" if name == "llama2" else ""
                        kw = {} if THINKING.get(name) is None else {"enable_thinking": THINKING[name]}
                        out = t.render(messages=msgs, add_generation_prompt=bool(gen),
                                       bos_token=bos, eos_token="</s>", **kw)
                        if name == "llama2" and out.startswith("<s>"):
                            out = out[3:]
                        f.write("R %s %d %d %d %s\n" % (name, ci, k, gen, hexs(out)))


if __name__ == "__main__":
    main()
