"""Chat templates of the model families users train, written here from their documented rendering
rules (model cards and public documentation), not copied from any template file. Each entry is
``name -> (jinja template, template kwargs a user of that family passes)``.

What each one reproduces, the part that matters for turn-by-turn continuation:
- ``chatml``: ``<|im_start|>role\\n...<|im_end|>\\n`` for every turn; generation prompt
  ``<|im_start|>assistant\\n`` (SmolLM2, Qwen2.5).
- ``qwen3_hybrid``: ChatML with a think block on every assistant turn after the last user turn
  (``<think>\\n{reasoning}\\n</think>\\n\\n``, empty when there is none) and none on earlier turns;
  ``enable_thinking=False`` appends an empty think block to the generation prompt.
- ``qwen3_2507_instruct``: the same history rule, generation prompt without a think block.
- ``qwen3_2507_thinking``: the same history rule, generation prompt that opens ``<think>\\n``, so
  the model's output is ``reasoning</think>`` then the action.
- ``llama3``: ``<|begin_of_text|>``, header tokens around the role, trimmed content, ``<|eot_id|>``;
  a system block with the knowledge-date preamble always comes first (Llama 3.1).
- ``no_system``: Gemma/Mistral style: a system message raises, roles must alternate, the
  assistant is called ``model``.
"""

from __future__ import annotations

CHATML = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The Qwen3 history rule, shared by the three Qwen3 entries: the index of the last user turn, then
# a think block only on the assistant turns that follow it.
_QWEN3_HISTORY = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{{ '<|im_start|>system\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'user' %}{{ '<|im_start|>user\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'assistant' %}"
    "{%- set content = m['content'] %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
)

QWEN3_HYBRID = _QWEN3_HISTORY + (
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)

QWEN3_2507_INSTRUCT = _QWEN3_HISTORY + "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"

QWEN3_2507_THINKING = _QWEN3_HISTORY + (
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{{- '<|begin_of_text|>' }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' + system + '<|eot_id|>' }}"
    "{%- for m in rest %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

NO_SYSTEM = (
    "{{- '<bos>' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

TEMPLATES = {
    "chatml": (CHATML, {}),
    "qwen3_hybrid": (QWEN3_HYBRID, {"enable_thinking": False}),
    "qwen3_2507_instruct": (QWEN3_2507_INSTRUCT, {}),
    "qwen3_2507_thinking": (QWEN3_2507_THINKING, {}),
    "llama3": (LLAMA3, {}),
    "no_system": (NO_SYSTEM, {}),
}
"""name -> (template, the chat_template_kwargs a user of that family passes)."""

STABLE_HISTORY = ("chatml", "llama3", "no_system")
"""Templates that render an earlier assistant turn as it was generated, so a whole call equals the
template applied to the whole conversation: exactly for ChatML, and for Llama 3 and no_system only
when each turn's content has no surrounding whitespace (they trim it; a real model often opens a
turn with a newline). The Qwen3 ones render the last assistant turn with a think block; hybrid and
Thinking also drop an earlier turn's think block. Qwen3-2507 Instruct's prompts at every turn are
still its own rendering of the conversation so far (its generation prompt has no think block, like
its history), which ``PROMPT_STABLE`` adds."""

PROMPT_STABLE = STABLE_HISTORY + ("qwen3_2507_instruct",)
"""Templates whose every turn's prompt equals the template applied to the conversation so far."""
