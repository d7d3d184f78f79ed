"""A plan's predicted step times (``step_time.py``) on a device and cluster: for a shardwise-train
config (``for_config``: its model, micro-batches, precision, checkpointing and tp cut, the row its
strategy runs) or for a bundled GPT preset (``for_gpt``: the row the planner recommends).

``Prediction.predicted`` holds the one row a run would use, under the names the run's records
use: ``step_s``, ``tokens_per_s``, ``compute_s``, ``comm_s`` and, per rank,
``peak_rss_mb_per_rank`` on the CPU (the row's bytes as a rank's resident set holds them:
``calibration.DeviceRates.peak_memory_bytes``) or ``peak_device_mb_per_rank`` on a GPU
(the row's bytes: what ``torch.cuda.max_memory_allocated`` counts, without the CUDA context).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from . import step_time
from .calibration import device_key, oversubscription_penalty, rates_for
from .cluster import Cluster
from .collective_latency import latency_for
from .device import cpu_threads_per_rank
from .gpt_costs import engine_counts, gpt_traces, parameter_tensors


@dataclass(frozen=True)
class Prediction:
    device: str
    source: str  # what the device's rates rest on (calibration.DeviceRates.source)
    strategy: str  # the row ``predicted`` describes
    times: dict  # strategy -> StepTime | None (communication unknown)
    ranking: tuple[str, ...]  # the rows that fit, fastest first
    predicted: dict | None

    def start_line(self) -> str:
        """The console's account of the prediction when a run starts."""
        p = self.predicted
        if p is None:
            return f"no step-time prediction for {self.strategy}: its communication is unknown"
        return (
            f"predicted step ({self.strategy} on {self.device}, {self.source}): "
            f"{p['step_s']:.3g} s, {p['tokens_per_s']:.0f} tokens/s (compute "
            f"{p['compute_s']:.3g} s, communication {p['comm_s']:.3g} s)"
        )

    def measured_line(self, step_seconds: list[float], peak_mb: float | None = None) -> str:
        """The summary's step time against the prediction: the median step after the first
        (which pays for warm-up), or the only one; and the largest rank's peak memory
        (``peak_mb``: its resident set on the CPU, its allocated bytes on a GPU) against the
        predicted one."""
        timed = step_seconds[1:] or step_seconds
        measured = statistics.median(timed)
        if self.predicted is None:
            return f"step time: measured {measured:.3g} s (no prediction)"
        expected = self.predicted["step_s"]
        line = (
            f"step time: predicted {expected:.3g} s, measured {measured:.3g} s "
            f"({(measured - expected) / expected:+.0%}; median of {len(timed)} steps)"
        )
        key = next((k for k in self.predicted if k.startswith("peak_")), None)
        if peak_mb is None or key is None:
            return line
        name = "peak RSS" if key == "peak_rss_mb_per_rank" else "peak device memory"
        memory = self.predicted[key]
        return (
            f"{line}; {name}: predicted {memory:.0f} MiB, measured {peak_mb:.0f} MiB "
            f"({(peak_mb - memory) / memory:+.0%}; the largest rank's)"
        )

    def to_dict(self) -> dict:
        times = {k: (v.to_dict() if v else None) for k, v in self.times.items()}
        return {
            "device": self.device,
            "source": self.source,
            "strategy": self.strategy,
            "step_times": times,
            "ranking": list(self.ranking),
            "predicted": self.predicted,
        }


def _size_ratio(gpt, tp: int = 1) -> float:
    """A model traced as the bundled GPT of its width, depth, heads and vocabulary (one cut by
    tp, or a ``causal_lm.ModelShape`` without its builder): its own layers differ (Llama's
    SwiGLU MLP has three matrices), so its compute is scaled by its parameters over that GPT's
    (training FLOPs grow with the parameters, 6 per parameter and token). 1 for the bundled
    GPT and for a model traced itself."""
    from dataclasses import fields

    from ..models.gpt import GPTConfig

    if type(gpt) is GPTConfig or (tp == 1 and getattr(gpt, "builder", None) is not None):
        return 1.0  # the bundled GPT, or a model traced itself (gpt_costs._rank_model)
    proxy = GPTConfig(**{f.name: getattr(gpt, f.name) for f in fields(GPTConfig)})
    return gpt.num_parameters() / proxy.num_parameters()


def _stages(result, gpt, micro_batch_size, bf16, checkpointing, tp, rates, pipeline) -> dict:
    """``Work``'s per-stage costs for a pipeline cut by parameters without tensor parallelism
    (``stage_costs.py``); nothing otherwise: a cut by measured time balances the stages, stages
    cut by tp are priced as the uniform share of the traced rank, and a model the pipeline has
    no blocks for (a family ``model_blocks`` does not cover) can only be planned uniform."""
    stages = result.pipeline_stages * int(pipeline.get("virtual_stages", 1))
    if result.pipeline_stages < 2 or tp > 1 or pipeline.get("split", "parameters") != "parameters":
        return {}
    from .stage_costs import pipeline_makespan, stage_seconds, stage_traces

    try:
        traces = stage_traces(gpt, stages, micro_batch_size, bf16, checkpointing)
    except ValueError:  # a model the pipeline cannot cut into blocks: its row is priced uniform
        return {}
    scale = _size_ratio(gpt, tp)
    seconds = tuple((f * scale, b * scale) for f, b in stage_seconds(traces, rates))
    schedule = pipeline.get("schedule", "1f1b")
    m = result.micro_batches
    return {"pipeline_s": pipeline_makespan(seconds, result.pipeline_stages, m, schedule)}


def _schedule_runs(result, pipeline: dict) -> int:
    """How many times a step runs the pipeline's schedule: once per accumulated batch of the
    config's micro-batches (``num_microbatches``, by default the stages)."""
    per_run = pipeline.get("num_microbatches") or result.pipeline_stages
    return max(1, result.micro_batches // per_run)


def _this_gpu() -> str:
    """This machine's GPU's table key when it has one that is listed, else h100."""
    import torch

    if torch.cuda.is_available():
        try:
            return device_key(torch.cuda.get_device_name())
        except ValueError:
            pass
    return "h100"


def for_gpt(
    result,
    gpt,
    *,
    micro_batch_size: int,
    checkpointing: bool,
    strategy: str,
    device: str = "cpu",
    cluster: Cluster | None = None,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
    deterministic: bool = False,
    low_params: bool = False,
    pipeline: dict | None = None,
    flat_update: bool = False,
    zero_buckets: tuple[int, int] | None = None,
) -> Prediction:
    """The step times of ``result``'s rows for the bundled GPT ``gpt`` traced at
    ``micro_batch_size`` sequences (on one tp rank of ``tp``), and ``strategy``'s as
    ``predicted``. ``device``: ``cpu`` or a GPU (``calibration.device_key``); ``low_params``:
    the engine computes with bf16 parameters and no autocast (``gpt_costs.gpt_traces``);
    ``pipeline``: the config's pipeline section (schedule, virtual stages, split);
    ``flat_update``: the engine steps one flat partition (ZeRO), not the module's tensors;
    ``zero_buckets``: the ZeRO engine's (reduce, all-gather) bucket sizes in elements (default:
    DeepSpeed's)."""
    per_host = result.ranks_per_host or result.world_size
    device = device_key(device)
    cluster = cluster or Cluster(device, result.hosts, per_host * tp, 1.0)
    cores = cluster.cores_per_host  # None: this host's
    threads = cpu_threads_per_rank(per_host * tp, deterministic, cores)
    rates = rates_for(device, threads)
    bf16 = result.mixed_precision != "fp32"
    full, forward = gpt_traces(
        gpt, micro_batch_size, bf16, tp, sequence_parallel, save_gathered, low_params and bf16
    )
    seconds = step_time.trace_seconds(full, rates)
    if checkpointing:
        seconds += step_time.trace_seconds(forward, rates)
    seconds *= _size_ratio(gpt, tp)
    work = step_time.Work(
        seconds,
        result.micro_batches,
        result.micro_batches * micro_batch_size * gpt.seq_len,
        step_time.update_bytes(result.optimizer, result.mixed_precision),
        traced_tp=tp,
        parameter_tensors=parameter_tensors(gpt),
        flat_update=flat_update,
        engine=replace(
            engine_counts(gpt, full, forward, *(zero_buckets or ())),
            pipeline_runs=_schedule_runs(result, pipeline or {}),
            zero_engine=flat_update,  # the ZeRO engine: its flat partition, reduced each time
        ),
        checkpointing=checkpointing,
        **_stages(result, gpt, micro_batch_size, bf16, checkpointing, tp, rates, pipeline or {}),
    )
    latency = latency_for(
        device,
        rates.collective_step_seconds,
        rates.message_seconds or None,
        cluster.intra_host_latency_us,
        cluster.inter_host_latency_us,
    )
    links = step_time.Links(
        cluster.intra_host_bytes_per_s(rates.memory_bytes_per_s),
        cluster.inter_host_bytes_per_s(),
        latency,
    )
    contention = 1.0
    if device == "cpu":
        contention = step_time.cpu_contention(per_host * tp, threads, cores)
        if contention > 1:  # ranks take turns: priced at what taking them measures
            penalty = oversubscription_penalty()
            contention = step_time.cpu_contention(per_host * tp, threads, cores, penalty)
    times = step_time.predict_plan(result, work, rates, links, contention)
    ranking = step_time.rank_rows(times, {r.strategy: r.fits for r in result.rows})
    chosen = times.get(strategy)
    predicted = None
    if chosen is not None:
        row = result.row(strategy)
        predicted = {k: getattr(chosen, k) for k in ("step_s", "tokens_per_s", "compute_s")}
        predicted["comm_s"] = chosen.comm_s
        if device == "cpu":
            rss = rates.peak_memory_bytes(row.total) / 2**20
            predicted["peak_rss_mb_per_rank"] = round(rss, 1)
        else:
            predicted["peak_device_mb_per_rank"] = round(row.total / 2**20, 1)
    return Prediction(device, rates.source, strategy, times, tuple(ranking), predicted)


def for_config(cfg, result, device: str | None = None, cluster: Cluster | None = None):
    """The prediction of a shardwise-train config's plan (``config_plan.plan_for_config``) on
    ``device`` (default: the cluster's; else ``cpu`` for a CPU run, else this machine's GPU
    when listed, else h100). The micro-batches per step are the plan's, the row the config's
    (``config_plan.config_row``)."""
    from .config_plan import config_row, low_precision_parameters

    d, t, gpt = cfg.distributed, cfg.training, cfg.gpt_config()
    if device is None and cluster is not None:
        device = cluster.device
    if device is None:
        device = "cpu" if t.device == "cpu" else _this_gpu()
    return for_gpt(
        result,
        gpt,
        micro_batch_size=t.micro_batch_size,
        checkpointing=cfg.activation_checkpointing,
        strategy=config_row(cfg, result).strategy,
        device=device,
        cluster=cluster,
        tp=d.tensor_parallel_size,
        sequence_parallel=d.sequence_parallel,
        save_gathered=d.sequence_parallel_save_gathered,
        deterministic=t.deterministic,
        low_params=low_precision_parameters(cfg),
        pipeline=d.pipeline.model_dump() if d.pipeline else None,
        flat_update=d.strategy == "zero",
        zero_buckets=_zero_buckets(cfg) if d.strategy == "zero" else None,
    )


def _zero_buckets(cfg) -> tuple[int, int]:
    """The ZeRO engine's (reduce, all-gather) bucket sizes in elements, as it reads them (the
    validated config's ``native`` options)."""
    native = cfg.zero_config()["native"]
    return native["reduce_bucket_numel"], native["allgather_bucket_numel"]
