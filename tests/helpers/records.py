"""Small hand-made records for the method tests."""

from mopd.core.records import AgentCall, Event, Passage, Segment, WorkflowRecord


def call(call_id, role, model_texts, *, env_len=2, tok=10, invalid=False, group="", step=0):
    """A call alternating env segments of `env_len` tokens and model segments of 2 tokens each."""
    segs = []
    for i, text in enumerate(model_texts):
        segs.append(Segment([1] * env_len, "env", "env"))
        segs.append(Segment([tok + i, tok + i + 1], "model", text, [-0.5, -1.0]))
    return AgentCall(call_id=call_id, role=role, segments=segs, invalid=invalid, group=group, step=step)


def search(step, cid, q="q", n=3):
    return Event("search", step, cid, q, passages=[Passage(str(i), "p") for i in range(n)])


def record(qid="q1", attempt=0, answers=("Paris",), candidates=(), calls=(), events=(), workflow="hmas"):
    return WorkflowRecord(question_id=qid, dataset="nq", question="Where?", answers=list(answers),
                          attempt=attempt, workflow=workflow, calls=list(calls), events=list(events),
                          candidates=list(candidates))
