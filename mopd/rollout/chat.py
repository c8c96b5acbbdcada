"""Chat-template rendering as token ids, and the text that continues a conversation after a model turn.

A multi-turn call is built from separately tokenised pieces: the first prompt (the chat template
applied to system + user messages, up to and including the assistant header), each model turn
(the sampled ids), and each environment turn appended after it. The environment turn's text is
derived once from the tokenizer's own chat template (render a conversation with placeholder
contents and cut it apart), so any ChatML-like template works, Qwen's included:

    (model turn ...<|im_end|>)  "\\n<|im_start|>user\\n" + content + "<|im_end|>\\n<|im_start|>assistant\\n"

When the model turn ended on a stop string instead of EOS, the continuation first closes the
assistant message with the template's full end text (``<|im_end|>\\n``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

_ASSISTANT = "ASSISTANTCONTENT7"
_USER = "USERCONTENT7"


class ChatTemplateError(ValueError):
    """A tokenizer whose chat template cannot be continued turn by turn."""


@dataclass(frozen=True)
class ChatFormat:
    assistant_end: str
    """Text the template writes right after an assistant message's content (``<|im_end|>\\n``)."""
    user_prefix: str
    """Text before a user message's content (``<|im_start|>user\\n``)."""
    user_suffix: str
    """Text after a user message's content, through the next assistant header."""
    eos_text: str
    """The EOS token's text (``<|im_end|>``)."""

    def continuation(self, content: str, after_eos: bool) -> str:
        """Text of an environment (user) turn appended after a model turn."""
        end = self.assistant_end
        if after_eos and end.startswith(self.eos_text):
            end = end[len(self.eos_text):]
        return end + self.user_prefix + content + self.user_suffix


_CACHE: Dict[tuple, ChatFormat] = {}


def chat_format(tokenizer) -> ChatFormat:
    """The continuation pieces of ``tokenizer``'s chat template (cached per template and EOS)."""
    key = (str(getattr(tokenizer, "chat_template", "")), tokenizer.eos_token)
    if key in _CACHE:
        return _CACHE[key]
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": _ASSISTANT}]
    a = tokenizer.apply_chat_template(base, tokenize=False)
    b = tokenizer.apply_chat_template(base + [{"role": "user", "content": _USER}], tokenize=False,
                                      add_generation_prompt=True)
    if not b.startswith(a) or _ASSISTANT not in a or _USER not in b[len(a):]:
        raise ChatTemplateError("the tokenizer's chat template does not render a conversation as a prefix "
                                "of its continuation; multi-turn calls cannot be appended token-exactly")
    assistant_end = a[a.index(_ASSISTANT) + len(_ASSISTANT):]
    tail = b[len(a):]
    i = tail.index(_USER)
    eos = tokenizer.eos_token or ""
    fmt = ChatFormat(assistant_end=assistant_end, user_prefix=tail[:i], user_suffix=tail[i + len(_USER):],
                     eos_text=eos)
    _CACHE[key] = fmt
    return fmt


def render_ids(tokenizer, messages: List[dict]) -> List[int]:
    """Token ids of ``messages`` through the chat template, ending with the assistant header."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    return list(ids)


def continuation_ids(tokenizer, content: str, after_eos: bool = True) -> List[int]:
    """Token ids of an environment turn with ``content`` appended after a model turn (tokenised
    on its own, never merged with the model's ids)."""
    text = chat_format(tokenizer).continuation(content, after_eos)
    return tokenizer.encode(text, add_special_tokens=False)
