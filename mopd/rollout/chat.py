"""Chat-template rendering as token ids, and the text that continues a conversation after a model turn.

A multi-turn call is built from separately tokenised pieces: the first prompt (the chat template
applied to the system + user messages, with its generation prompt), each model turn (the sampled
ids), and each environment turn appended after it. The environment turn's text is cut once from
one rendering of the tokenizer's own template in which the model turn is NOT the last one:

    [system, user, assistant=A, user=U] + generation prompt
    -> ... A | turn_end | U | user_suffix

``turn_end`` closes the assistant turn and opens the user turn (ChatML: ``<|im_end|>\\n<|im_start|>
user\\n``), ``user_suffix`` closes the user turn and writes the generation prompt again. Cutting
from a rendering where the model turn is last would be wrong for templates that render the last
assistant turn their own way (Qwen3 writes a think block only on turns after the last user turn).
When the model turn ended on an EOS token whose text opens ``turn_end``, that text is not written
twice; when it ended on a stop string, ``turn_end`` closes it in full.

Templates that reject a system role (Gemma, Mistral) get the system prompt folded into the first
user turn. ``template_kwargs`` (``model.chat_template_kwargs``, e.g. ``enable_thinking=False``)
reach every rendering. A template that cannot be continued this way is a one-line
:class:`ChatTemplateError`, raised by :func:`check_chat_template` before any engine starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from mopd.core.errors import UserError

_SYSTEM = "SYSTEMCONTENT7"
_USER = "USERCONTENT7"
_ASSISTANT = "ASSISTANTCONTENT7"
_USER2 = "USERCONTENT8"


class ChatTemplateError(UserError, ValueError):
    """A tokenizer whose chat template cannot be continued turn by turn, token-exactly."""


@dataclass(frozen=True)
class ChatFormat:
    turn_end: str
    """Text from the end of a model turn's content to the start of the next user content."""
    user_suffix: str
    """Text after a user content, through the generation prompt."""
    system_role: bool
    """False: the template rejects (or drops) a system message; it is folded into the first user turn."""

    def continuation(self, content: str, ended_with: str = "") -> str:
        """Text of an environment (user) turn after a model turn that ended with the text
        ``ended_with`` (its EOS token's text; empty when it stopped on a stop string)."""
        end = self.turn_end
        if ended_with and end.startswith(ended_with):
            end = end[len(ended_with):]
        return end + content + self.user_suffix


_CACHE: Dict[tuple, ChatFormat] = {}


def _key(tokenizer, template_kwargs: Optional[Mapping]) -> tuple:
    kwargs = tuple(sorted((template_kwargs or {}).items()))
    return str(getattr(tokenizer, "chat_template", "")), kwargs


def _render(tokenizer, messages: List[dict], template_kwargs: Optional[Mapping], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation,
                                         **dict(template_kwargs or {}))


def _accepts_system(tokenizer, template_kwargs) -> bool:
    try:
        text = _render(tokenizer, [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}],
                       template_kwargs, True)
    except Exception:  # noqa: BLE001 - a template rejects a system role with raise_exception (any error type)
        return False
    return _SYSTEM in text


def fold_system(messages: List[dict]) -> List[dict]:
    """``messages`` with a leading system message merged into the first user message."""
    if len(messages) < 2 or messages[0]["role"] != "system" or messages[1]["role"] != "user":
        return list(messages)
    user = {"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}
    return [user] + list(messages[2:])


def chat_format(tokenizer, template_kwargs: Optional[Mapping] = None) -> ChatFormat:
    """The continuation pieces of ``tokenizer``'s chat template under ``template_kwargs`` (cached)."""
    key = _key(tokenizer, template_kwargs)
    if key in _CACHE:
        return _CACHE[key]
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("the tokenizer has no chat template; give the model one "
                                "(tokenizer_config.json or chat_template.jinja)")
    system_role = _accepts_system(tokenizer, template_kwargs)
    head = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}]
    if not system_role:
        head = fold_system(head)
    conv = head + [{"role": "assistant", "content": _ASSISTANT}, {"role": "user", "content": _USER2}]
    try:
        first = _render(tokenizer, head, template_kwargs, True)
        text = _render(tokenizer, conv, template_kwargs, True)
    except Exception as e:  # noqa: BLE001 - jinja raises its own and the template's errors
        raise ChatTemplateError(f"the chat template cannot render a user/assistant/user conversation: "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    a, u = text.find(_ASSISTANT), text.find(_USER2)
    if a < 0 or u < a or text.count(_ASSISTANT) != 1 or text.count(_USER2) != 1:
        raise ChatTemplateError("the chat template does not render an assistant turn followed by a user "
                                "turn with their contents verbatim; multi-turn calls cannot be continued")
    fmt = ChatFormat(turn_end=text[a + len(_ASSISTANT):u], user_suffix=text[u + len(_USER2):],
                     system_role=system_role)
    # The first prompt ends as every later one must: the user turn's end and the generation prompt.
    if not first.endswith(_USER + fmt.user_suffix):
        raise ChatTemplateError("the chat template ends a first prompt differently from a later one "
                                f"({first[first.find(_USER) + len(_USER):]!r} vs {fmt.user_suffix!r}); "
                                "multi-turn calls cannot be continued token-exactly")
    for piece in (fmt.turn_end, fmt.user_suffix):
        ids = tokenizer.encode(piece, add_special_tokens=False)
        if tokenizer.decode(ids) != piece:
            raise ChatTemplateError(f"the template text {piece!r} does not survive the tokenizer's round "
                                    "trip (encode, decode); environment turns cannot be appended exactly")
    _CACHE[key] = fmt
    return fmt


def check_chat_template(tokenizer, template_kwargs: Optional[Mapping] = None, name: str = "") -> ChatFormat:
    """:func:`chat_format`, its error naming the model (``name``): call before any engine starts."""
    try:
        return chat_format(tokenizer, template_kwargs)
    except ChatTemplateError as e:
        where = f"{name}: " if name else ""
        raise ChatTemplateError(f"{where}{e}") from None


def render_ids(tokenizer, messages: List[dict], template_kwargs: Optional[Mapping] = None) -> List[int]:
    """Token ids of ``messages`` through the chat template, with its generation prompt (the system
    message folded into the first user turn where the template has no system role)."""
    if messages and messages[0]["role"] == "system" and not chat_format(tokenizer, template_kwargs).system_role:
        messages = fold_system(messages)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False,
                                        **dict(template_kwargs or {}))
    return list(ids)


def continuation_ids(tokenizer, content: str, after_eos: bool = True, template_kwargs: Optional[Mapping] = None,
                     eos_text: Optional[str] = None) -> List[int]:
    """Token ids of an environment turn with ``content`` appended after a model turn (tokenised
    on its own, never merged with the model's ids). ``after_eos``: the model turn ended on an EOS
    token, whose text is ``eos_text`` (default: the tokenizer's EOS token)."""
    ended = (tokenizer.eos_token if eos_text is None else eos_text) if after_eos else ""
    text = chat_format(tokenizer, template_kwargs).continuation(content, ended or "")
    return tokenizer.encode(text, add_special_tokens=False)
