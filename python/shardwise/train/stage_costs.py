"""A pipeline's stages priced one by one, and its step as the schedule runs them.

The model is cut as the engine cuts it (``parallelize.model_blocks``, then
``pipeline.split_by_parameters``: the trainer's default split), each stage's forward and backward
is traced on fake tensors (``op_trace.trace``: its forward under the run's autocast, the last
stage's loss included, then its backward, activation checkpointing's recomputation included) and
priced on a device (``step_time.trace_seconds``). The compute of one pipeline replica's step is
then the makespan of its schedule (1F1B, ZB-H1, interleaved) over those per-stage costs, from
the schedule's own simulator (``pipeline.validate``, C++); ``step_time.Work.pipeline_s`` carries
it to the pipeline row.

A GPT's stages are not equal when they hold equal parameters: the embedding costs a lookup, the
head and the loss cost a matrix product and a softmax over the vocabulary. The slowest stage
sets the pace, and the ``(m + p - 1)`` slots of the average stage that a uniform model assumes
predicted a 2-stage tiny GPT's 1F1B step 42% short.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=16)
def stage_traces(
    gpt_config, stages: int, micro_batch_size: int, bf16: bool, checkpointing: bool = False
):
    """Per stage, in order: (forward trace, backward trace) of one micro-batch on one rank."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .. import pipeline as pp
    from .gpt_costs import _rank_model
    from .op_trace import trace
    from .parallelize import _plain_loss, model_blocks

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = _rank_model(gpt_config, 1, False, False)
        if checkpointing and hasattr(model, "blocks"):  # as parallelize.checkpoint_activations
            from .recompute import checkpoint_blocks

            checkpoint_blocks(model.blocks)
        blocks, _ = model_blocks(model)
        groups = pp.split_by_parameters(blocks, stages)
        tokens = torch.zeros(micro_batch_size, gpt_config.seq_len, dtype=torch.long)
        x, traced = tokens, []
        for k, group in enumerate(groups):
            body = torch.nn.Sequential(*(blocks[i] for i in group))
            inputs = x if k == 0 else x.detach().requires_grad_()
            held, last = {}, k == len(groups) - 1

            def forward(body=body, inputs=inputs, held=held, last=last):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    held["out"] = body(inputs)
                held["loss"] = _plain_loss(held["out"], tokens) if last else None

            def backward(held=held):
                if held["loss"] is not None:
                    held["loss"].backward()
                else:
                    held["out"].backward(torch.ones_like(held["out"]))

            traced.append((trace(forward), trace(backward)))
            x = held["out"]
    return tuple(traced)


def stage_seconds(traces, rates) -> tuple[tuple[float, float], ...]:
    """(forward, backward) seconds of each stage's traces on a device."""
    from .step_time import trace_seconds

    return tuple((trace_seconds(f, rates), trace_seconds(b, rates)) for f, b in traces)


def pipeline_makespan(
    seconds: tuple[tuple[float, float], ...], ranks: int, micro_batches: int, schedule: str = "1f1b"
) -> float:
    """Seconds of one step of ``schedule`` over ``ranks`` ranks and ``micro_batches``
    micro-batches, stage k costing ``seconds[k]`` (its virtual stages: ``len(seconds) / ranks``
    per rank), as the schedule's simulator times it (communication free)."""
    from .. import pipeline as pp

    built = pp.make_schedule(schedule, ranks, micro_batches, len(seconds) // ranks)
    report = pp.validate(
        built, stage_forward=[f for f, _ in seconds], stage_backward=[b for _, b in seconds]
    )
    if not report["ok"]:
        raise ValueError(f"the {schedule} schedule does not validate: {report['error']}")
    return report["makespan"]
