"""Builds one AgentCall turn by turn, token-exactly, with its input/output limits and counts.

The call's ids are the concatenation of separately tokenised segments: the first prompt, then
alternately model turns (sampled ids with their log-probs, EOS included when generated) and
environment turns (:func:`mopd.rollout.chat.continuation_ids`). The ids of each request are the
call's ids so far, so the trainer's ``call.token_ids()`` is exactly what the engine saw.

Limits: a first prompt longer than ``max_input_tokens`` is cut from the left (the question sits
last in every role prompt) and the call is marked ``truncated_input``; a later turn whose prompt
would exceed the limit is not sent: the call ends there (``truncated_input`` too) and the agent
takes its forced way out. ``max_output_tokens`` caps each turn (the engine reports 'length').
"""

from __future__ import annotations

from typing import List

from mopd.core.generation import Completion, GenerationRequest, SamplingParams
from mopd.core.records import AgentCall, Segment
from mopd.rollout.chat import continuation_ids


class Transcript:
    def __init__(self, call: AgentCall, tokenizer, max_input_tokens: int, eos_ids=None, template_kwargs=None):
        self.call = call
        self.tokenizer = tokenizer
        self.max_input_tokens = max_input_tokens
        self.eos_ids = set(eos_ids) if eos_ids else {tokenizer.eos_token_id}
        """The ids the engine stops on (the generation config's EOS ids as well as the tokenizer's)."""
        self.template_kwargs = template_kwargs
        self.turns = 0

    def start(self, prompt_ids: List[int]) -> bool:
        """Set the first prompt; returns False when it had to be cut to the input limit."""
        ids = list(prompt_ids)
        fits = len(ids) <= self.max_input_tokens
        if not fits:
            ids = ids[-self.max_input_tokens:]
            self.call.truncated_input = True
        self.call.segments.append(Segment(token_ids=ids, source="env", text=self.tokenizer.decode(ids)))
        return fits

    def append_env(self, content: str) -> bool:
        """Append an environment turn; returns False (appending nothing) when the next prompt
        would exceed the input limit."""
        eos = self.ended_with_eos()
        ids = continuation_ids(self.tokenizer, content, after_eos=eos, template_kwargs=self.template_kwargs,
                               eos_text=self.tokenizer.decode([self.call.segments[-1].token_ids[-1]]) if eos else "")
        if len(self.call) + len(ids) > self.max_input_tokens:
            self.call.truncated_input = True
            return False
        self.call.segments.append(Segment(token_ids=ids, source="env", text=self.tokenizer.decode(ids)))
        return True

    def ended_with_eos(self) -> bool:
        last = self.call.segments[-1] if self.call.segments else None
        return bool(last and last.source == "model" and last.token_ids and last.token_ids[-1] in self.eos_ids)

    def request(self, params: SamplingParams) -> GenerationRequest:
        """The request for the next turn; counts its prompt in the call's input tokens."""
        ids = self.call.token_ids()
        self.call.input_tokens += len(ids)
        self.turns += 1
        return GenerationRequest(prompt_ids=ids, params=params)

    def add_model_turn(self, completion: Completion) -> None:
        self.call.segments.append(Segment(token_ids=list(completion.token_ids), source="model",
                                          text=completion.text, logprobs=[float(x) for x in completion.logprobs]))
        self.call.output_tokens += len(completion.token_ids)
        self.call.finish_reasons.append(completion.finish_reason)
