"""The training loop of ``shardwise-train`` and ``shardwise.Trainer`` (``api.py``).

``TrainingRun(cfg).run()`` (a validated ``TrainConfig``): set up the process group, apply the
parallelism transforms to identically initialized models and make the one train step over them
(``step.build``), resume from the newest intact checkpoint, then per step: draw the
gradient-accumulation micro-batches of this data rank, step with the scheduled learning rate,
log the metrics, and checkpoint every ``training.checkpoint.every_steps`` and on SIGTERM or
SIGINT (then stop). At the end: a last checkpoint, the full model as safetensors, a text sample.

A checkpoint holds, per rank: the strategy's world-size-independent pieces (or ZeRO's own), the
optimizer step, this rank's RNG state and the data position; the manifest holds the config.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .. import _C, pieces
from ..models.causal_lm import export_names
from ..models.gpt import GPT, GPTConfig
from . import (
    async_checkpoint,
    checkpoint_verify,
    consistency,
    datasets,
    device_check,
    metrics,
    sources,
)
from . import checkpoint as ckpt
from . import cost as cost_mod
from . import data as data_mod
from . import device as device_mod
from . import step as step_mod
from .parallelize import StrategyOptions, compile_counts

if TYPE_CHECKING:
    from .config import TrainConfig

SAMPLE_TOKENS = 200  # the text sample's length after training


def init_distributed(
    backend: str, layout: dict | None = None, timeout_s: float | None = None
) -> tuple[int, int]:
    """The process group from torchrun's environment, completed by the config's ``layout``
    (processes launched by hand with distributed.rank, world_size, master_addr and
    master_port), or a one-rank group for a single process (FSDP and ZeRO need one); its
    collectives time out after ``timeout_s`` (None: torch's default). Returns (rank, world)."""
    for var, value in (layout or {}).items():
        if value is not None:
            os.environ.setdefault(var, str(value))
    if not dist.is_initialized():
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        if os.environ["WORLD_SIZE"] == "1":  # a process of its own: any free local port
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        from .. import distributed  # registers the shardwise backend

        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        distributed.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


class TrainingRun:
    """One run of a validated ``TrainConfig`` (``load_config``): the loop reads its sections
    and the values it resolves (``run_gpt_config``, ``scaled_learning_rate``, ``layout``...)
    from the config itself; the transforms get theirs from ``StrategyOptions.from_config``.
    The data is the config's ``data`` section, or ``train_dataset`` (and ``eval_dataset``, no
    eval without one) in memory (``datasets.py``)."""

    def __init__(
        self,
        cfg: TrainConfig,
        resume: bool = True,
        memory_note: str = "",
        train_dataset=None,
        eval_dataset=None,
        predicted=None,
    ):
        self.cfg, self.resume_requested, self.memory_note = cfg, resume, memory_note
        self.predicted = predicted  # prediction.Prediction of this run's step, or None
        self._step_seconds: list[float] = []
        self._peak_mb: float | None = None
        t, d = cfg.training, cfg.distributed
        self.gpt = cfg.run_gpt_config()
        self.output_dir = Path(t.checkpoint.dir)
        self.device = device_mod.local_device(t.device, d.local_rank)  # before NCCL starts
        self.rank, self.world = init_distributed(d.backend, cfg.launch_env(), d.timeout_s)
        self.device_notes = _checked_devices(self.device, self.world, t.allow_mixed_devices)
        torch.set_num_threads(
            device_mod.cpu_threads_per_rank(_local_world(self.world), t.deterministic)
        )
        if t.deterministic:
            # cuBLAS picks a fixed workspace only when told so, before its first call
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        self.options = StrategyOptions.from_config(cfg)
        self.stepper = step_mod.build(d.strategy, self.options, self.world)
        group = self.stepper.data_group
        self.data_rank = dist.get_rank(group) if group is not None else 0
        self.data_world = dist.get_world_size(group) if group is not None else 1
        rows = t.micro_batch_size
        if d.strategy == "pipeline":  # the pipeline cuts its batch into microbatches
            rows *= d.pipeline.num_microbatches
        # deterministic: an epoch ends on the same item at every data-parallel size
        per_step = t.gradient_accumulation_steps if t.deterministic else 1
        order = {"contiguous": t.deterministic, "batches_per_step": per_step}
        if train_dataset is None:
            self.tokenizer, train_tokens, val_tokens = load_data(cfg.data, self.gpt)
            self.stream = data_mod.TokenStream(
                train_tokens, self.gpt.seq_len, rows, self.data_rank, self.data_world,
                cfg.data_seed, **order,
            )  # fmt: skip
            self.val_stream = validation_stream(
                val_tokens, self.gpt.seq_len, rows, self.data_rank, self.data_world, order
            )
        else:
            self.tokenizer = None
            place = (rows, self.data_rank, self.data_world)
            self.stream = datasets.stream(
                train_dataset, *place, cfg.data_seed, name="train_dataset", **order
            )  # fmt: skip
            self.val_stream = None
            if eval_dataset is not None:
                self.val_stream = datasets.stream(
                    eval_dataset, *place, 0, shuffle=False, name="eval_dataset", **order
                )
        self.stream_rows, self.batches_per_step = rows, order["batches_per_step"]
        self.saver = None  # the background writer, with its own process group (collective)
        if t.checkpoint.asynchronous:
            self.saver = async_checkpoint.AsyncSaver(d.timeout_s)
        self.step = 0
        self._slow, self._slow_streak = None, 0
        self.sinks = metrics.Sinks(self.output_dir, t.max_steps, 0, self.rank == 0)

    # --- checkpoints -----------------------------------------------------------------------

    def _payload(self, copy: bool = True) -> dict:
        """This rank's checkpoint: copies of its state, or (``copy=False``, for the
        asynchronous writer, which copies it to host memory itself) views of it."""
        s = self.stepper
        payload = {
            "step": self.step,
            "optimizer_step": s.optimizer_step_count(),
            "rng": torch.get_rng_state(),
            # the position and the global batch's windows it counts in (a resume at another
            # data-parallel size converts it)
            "data": {**self.stream.state(), "global_rows": self.stream_rows * self.data_world},
        }
        if s.engine is not None:  # ZeRO's own pieces
            payload["zero"] = s.payload()
        else:
            payload["pieces"] = pieces.to_pieces(s.save_slots(), copy=copy)
            payload["scaler"] = s.scaler_state()
        return payload

    def save(self) -> Path:
        """Checkpoint this step: written before returning, or (``checkpoint.async``) copied to
        host memory and written in the background (``async_checkpoint.py``)."""
        write = self.saver.save if self.saver is not None else ckpt.save
        return write(
            self.output_dir / "checkpoints",
            self.step,
            self._payload(copy=self.saver is None),
            self.rank,
            self.world,
            self.cfg.to_yaml(),
            self.cfg.training.checkpoint.keep_last,
        )

    def wait_for_save(self) -> None:
        """Until an asynchronous save in flight is complete (its error raised here)."""
        if self.saver is not None:
            self.saver.wait()

    def _agreed_checkpoint(self) -> Path | None:
        """The checkpoint every rank resumes from: rank 0 chooses, after removing killed writes'
        temporary files, and broadcasts its step (C++ ``agree_on_checkpoint``: ranks choosing
        alone could disagree, as the fault soak found)."""

        def broadcast_step(step: int) -> int:
            chosen = torch.tensor([step], dtype=torch.int64, device=self.device)
            dist.broadcast(chosen, src=0)
            return int(chosen.item())

        path, removed, skipped = ckpt.agree(
            self.output_dir / "checkpoints",
            self.rank,
            self.world,
            broadcast_step if self.world > 1 else None,
        )
        for leftover in removed:
            self.sinks.note(f"removed {leftover}: a write that never finished")
        for reason in skipped:  # a corrupt or incomplete newer one: say so, use the one before
            self.sinks.note(f"warning: {reason}")
        return path

    def resume(self) -> bool:
        path = self._agreed_checkpoint()
        if path is None:
            return False
        saved_world = ckpt.read_manifest(path)["world_size"]
        payloads = [ckpt.load(path, r) for r in range(saved_world)]
        if self.world > 1:  # no rank saves into the folder while another still reads it
            dist.barrier()
        s = self.stepper
        if s.engine is not None:
            if "zero" not in payloads[0]:
                raise ValueError(f"{path}: not a ZeRO checkpoint; resume it with its strategy")
            s.load_payloads([p["zero"] for p in payloads])
        else:
            if "pieces" not in payloads[0]:
                raise ValueError(f"{path}: a ZeRO checkpoint; resume it with strategy zero")
            pieces.fill(s.load_slots(), [x for p in payloads for x in p["pieces"]])
            s.set_optimizer_step_count(payloads[0]["optimizer_step"])
            s.load_scaler_state(payloads[0].get("scaler"))
        mine = payloads[self.rank] if self.rank < saved_world else payloads[0]
        if saved_world == self.world:  # the same ranks: this rank's own random stream
            torch.set_rng_state(mine["rng"])
        self.stream.load_state(self._stream_position(payloads[0]["data"]))
        self.step = int(payloads[0]["step"])
        self.sinks.note(f"resumed from {path} (step {self.step}, saved by {saved_world} ranks)")
        return True

    def _stream_position(self, saved: dict) -> dict:
        """The saved stream position in this run's global batches: the same windows read, when
        the data-parallel size (so the global batch's windows) changed; a position between two
        batches rounds down, with a note."""
        here = self.stream_rows * self.data_world
        there = int(saved.get("global_rows", here))
        read = int(saved["index"]) * there
        if read % here:
            self.sinks.note(f"resumed position rounded down: {read} windows read is not a whole "
                            f"number of global batches of {here}")  # fmt: skip
        return {"epoch": int(saved["epoch"]), "index": read // here}

    # --- the loop --------------------------------------------------------------------------

    def run(self) -> dict:
        cfg, t, gpt = self.cfg, self.cfg.training, self.gpt
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if restarts:  # torchrun --max-restarts brought the job back after a failure
            limit = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
            self.sinks.note(f"torchrun restart {restarts} of {limit}: resuming the newest "
                            "complete checkpoint")  # fmt: skip
        if self.resume_requested:
            self.resume()
        if self.sinks.bar is not None:
            self.sinks.bar.n = self.step
        self.sinks.note(
            f"strategy {cfg.distributed.strategy}, world {self.world}, effective batch "
            f"{cfg.effective_batch_size} sequences of {gpt.seq_len} tokens"
            + (f"\nmesh: {self.stepper.mesh_description}" if self.stepper.mesh_description else "")
            + (f"\n{self.memory_note}" if self.memory_note else "")
            + (f"\n{self.predicted.start_line()}" if self.predicted else "")
        )
        for line in self.device_notes:
            self.sinks.note(line)
        if t.checkpoint.verify_at_start:
            seconds = checkpoint_verify.round_trip(
                self.output_dir / "checkpoints", self.step, self._payload(), self.rank,
                self.world, cfg.to_yaml(), self.device,
            )  # fmt: skip
            self.sinks.note(
                f"checkpoints verified: step {self.step}'s state saved and loaded back bit for "
                f"bit in {seconds:.2f}s"
            )
        flops_token = metrics.flops_per_token(
            gpt.num_parameters(), gpt.layers, gpt.seq_len, gpt.dim
        )
        peak = self._peak_flops()
        stop = ckpt.install_sigterm_handler((signal.SIGTERM, signal.SIGINT))
        self._first_step = self.step + 1
        self.cost = cost_mod.RunCost(self.world, t.device_hour_price)
        last = {}
        cuda = self.device.type == "cuda"
        profile = t.profile.model_dump() if t.profile else None
        profiler = metrics.StepProfiler(profile, self.output_dir, self.rank, cuda)
        try:
            while self.step < t.max_steps and not stop.requested:
                last = self._one_step(flops_token, peak)
                profiler.step()
                every = cfg.eval_every
                due = (every and self.step % every == 0) or self.step == t.max_steps
                if due and self.val_stream is not None:
                    last["val_loss"] = self.evaluate()
                if self.step % t.log_every == 0 or self.step == t.max_steps:
                    self.sinks.write(last)
                # before a save: a state that fails the check is not checkpointed
                if t.consistency_every and self.step % t.consistency_every == 0:
                    self._check_consistency()
                if self.step % t.checkpoint.every_steps == 0 or stop.requested:
                    self.save()
        finally:
            profiler.close()
            stop.close()
        if self.predicted is not None and self._step_seconds:
            self.sinks.note(self.predicted.measured_line(self._step_seconds, self._peak_mb))
        if stop.requested:
            self.wait_for_save()
            name = signal.Signals(stop.signum).name
            self.sinks.note(f"{name}: saved step {self.step}; stopping")
        else:
            self.save()
            last.update(self._finish())  # the export overlaps an asynchronous last save
            self.wait_for_save()
        self.sinks.close()
        return last

    def _peak_flops(self) -> float:
        """The MFU denominator: on a GPU its data-sheet bf16 peak (measured when not listed), on
        the CPU a matmul measured in the training dtype."""
        if self.device.type == "cuda":
            listed = device_mod.bf16_peak(torch.cuda.get_device_name(self.device))
            return listed or metrics.measured_peak_flops(torch.bfloat16, device=self.device)
        return metrics.measured_peak_flops(
            torch.bfloat16 if self.options.precision == "bf16" else torch.float32
        )

    def _one_step(self, flops_token: float, peak: float) -> dict:
        cfg, t, seq_len = self.cfg, self.cfg.training, self.gpt.seq_len
        start = time.perf_counter()
        batches = [next(self.stream) for _ in range(t.gradient_accumulation_steps)]
        batches = [device_mod.to_device(b, self.device) for b in batches]
        data_s = time.perf_counter() - start
        self.step += 1
        # linear warm-up, then cosine decay to 10% (C++ training/lr_schedule.h, as train_gpt)
        lr = _C.warmup_cosine_lr(self.step, cfg.scaled_learning_rate, t.warmup_steps, t.max_steps)
        comm0, ops0 = _comm_seconds(), self._comm_stats()
        start = time.perf_counter()
        out = self.stepper.train_step(batches, lr)
        seconds = time.perf_counter() - start
        comm, ops1 = _comm_seconds() - comm0, self._comm_stats()  # before the metrics' gathers
        gpu = device_mod.gpu_memory_mb(self.device)  # [] on the CPU
        mine = {"step": seconds, "comm": comm, "rss": float(metrics.peak_rss_bytes())}
        mine["loss"] = out["local_loss"]
        mine.update(data=data_s, **self.stepper.phase_seconds)
        if gpu:  # allocated, reserved, peak
            mine.update(zip(("gpu_allocated", "gpu_reserved", "gpu_peak"), gpu, strict=True))
        per_rank = metrics.gather_dicts(mine)  # the step's one collective for the metrics
        step_s = max(r["step"] for r in per_rank)
        self._step_seconds.append(step_s)
        # the largest rank's peak so far: allocated on a GPU (MiB), else resident
        peaks = [r.get("gpu_peak", r["rss"] / 2**20) for r in per_rank]
        self._peak_mb = max(self._peak_mb or 0.0, *peaks)
        tokens = cfg.effective_batch_size * seq_len
        replica = self.stream_rows * t.gradient_accumulation_steps * seq_len  # same on every rank
        record = {
            "step": self.step,
            "loss": out["loss"],
            # each rank's own: the mean over its micro-batches (its replica's, on every stage)
            "loss_by_rank": [r["loss"] for r in per_rank],
            "lr": out["lr"],
            "grad_norm": out["grad_norm"],
            "loss_scale": self.stepper.loss_scale() if self.stepper.scaler is not None else None,
            "step_s": step_s,
            "tokens_per_s": tokens / step_s,
            # each rank's own: the tokens its replica read over its own step time
            "tokens_per_s_by_rank": [round(replica / r["step"], 1) for r in per_rank],
            "mfu": flops_token * tokens / step_s / self.world / peak,
            # the shardwise backend's busy time (other backends do not report theirs)
            "comm_share": max(r["comm"] / r["step"] for r in per_rank)
            if cfg.distributed.backend == "shardwise"
            else None,
            "peak_rss_mb_per_rank": [round(r["rss"] / 2**20, 1) for r in per_rank],
            **self.cost.record(tokens),
        }
        record.update(metrics.phase_fields(per_rank))
        if ops0 is not None:
            record["communication"] = metrics.communication_delta(ops0, ops1)
            self.sinks.note(metrics.communication_line(self.step, record["communication"]))
        for key in ("allocated", "reserved", "peak") if gpu else ():
            record[f"gpu_{key}_mb_per_rank"] = [round(r[f"gpu_{key}"], 1) for r in per_rank]
        if self.step == self._first_step:  # measured inside the step, gradients included
            state = metrics.gather_floats([float(self.stepper.state_bytes)])
            record["model_state_bytes_per_rank"] = [int(r[0]) for r in state]
        if self.options.compile:
            record["compile"] = compile_counts()
            if self.step == self._first_step:
                self.sinks.note(compile_line(record["compile"]))
        slow = metrics.straggler([r["step"] - r["comm"] for r in per_rank])
        self._slow_streak = self._slow_streak + 1 if slow is not None and slow == self._slow else 1
        self._slow = slow
        if slow is not None and self.world > 1 and self._slow_streak == 5:
            self.sinks.note(
                f"step {self.step}: rank {slow} is a straggler: its compute took "
                f"{per_rank[slow]['step'] - per_rank[slow]['comm']:.3f}s, > 1.25x the median, "
                "5 steps running"
            )
        return record

    def _check_consistency(self) -> None:
        """The replicated state's copies compared across every rank (``consistency.py``)."""
        mine = consistency.local_checksums(self.stepper.replicated_slots())
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, mine)
        problem = consistency.compare(gathered, self.step)
        if problem is None:
            return
        if self.cfg.training.consistency_action == "warn":
            self.sinks.note(f"warning: {problem}")
            return
        raise consistency.ConsistencyError(
            f"{problem}; stopping (training.consistency_action: warn goes on)"
        )

    def _comm_stats(self) -> dict | None:
        """The shardwise backend's counters when training.profile_communication is on."""
        if not self.cfg.training.profile_communication:
            return None
        return _C.communication_stats()

    def evaluate(self) -> float:
        """The eval loss over the first ``eval_batches`` validation batches (the same ones every
        time, so the values are comparable; collective). Deterministic: ``eval_batches``
        global batches of a training step, whatever the data-parallel size."""
        per_step = self.batches_per_step
        n = min(self.cfg.training.eval_batches * per_step, self.val_stream.batches_per_epoch)
        batches = [self.val_stream.batch(0, i) for i in range(n)]
        return self.stepper.eval_loss([device_mod.to_device(b, self.device) for b in batches])

    def _finish(self) -> dict:
        """The full model as safetensors (a Hugging Face model's with its config.json, so
        ``from_pretrained`` loads the folder) and a text sample (rank 0); under FSDP's
        ``sharded_state_dict`` / ``local_state_dict``, each rank's pieces instead."""
        if self.stepper.par.state_dict_type != "full_state_dict":
            return self._finish_sharded()
        state = {k: v.cpu() for k, v in self.stepper.full_state_dict().items()}
        result = {}
        if self.rank == 0:
            path = self.output_dir / "model.safetensors"
            build = self.options.build
            ckpt.export_safetensors(state if build is None else export_names(state), path)
            if build is not None and build.config() is not None:
                build.config().to_json_file(str(self.output_dir / "config.json"))
            result["safetensors"] = str(path)
            if self.tokenizer is not None:
                text = sample(state, self.gpt, SAMPLE_TOKENS, self.tokenizer, build)
                result["sample"] = text
                self.sinks.note(f"wrote {path}\nsample:\n{text}")
            else:
                self.sinks.note(f"wrote {path} (no sample: give data.tokenizer to decode one)")
        dist.barrier()
        return result

    def _finish_sharded(self) -> dict:
        """Each rank's pieces of the model's parameters, nothing gathered (a model too large
        for one rank's memory exports too), as a checkpoint in ``model-sharded/``: rank files and
        a manifest. ``load_sharded_model`` fills any model of the plain GPT's names from it."""
        slots = [s for s in self.stepper.save_slots() if ":" not in s.name]  # not the moments
        path = ckpt.save(
            self.output_dir / ckpt.SHARDED_EXPORT, self.step, {"pieces": pieces.to_pieces(slots)},
            self.rank, self.world, self.cfg.to_yaml(), keep_last=1,
        )  # fmt: skip
        self.sinks.note(
            f"wrote {path} ({self.stepper.par.state_dict_type}: each rank's pieces, no full "
            "model gathered; shardwise.train.checkpoint.load_sharded_model reads them)"
        )
        return {"sharded": str(path)}


def sample(
    state: dict, gpt: GPTConfig, tokens: int, tok=None, build=None, prompt: str = "The "
) -> str:
    """Text from the trained weights (a plain GPT, or what ``build`` makes), temperature 0.8,
    top-k 20, seeded."""
    model = GPT(gpt) if build is None else build(weights=False)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    model.eval()
    tok = tok or data_mod.ByteTokenizer()
    ids = tok.encode(prompt)[None]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(tokens):
            # only the tokenizer's ids (a preset may have a larger vocabulary than bytes)
            logits = model(ids[:, -gpt.seq_len :])[0, -1, : tok.vocab_size] / 0.8
            top = torch.topk(logits, 20)
            choice = torch.multinomial(torch.softmax(top.values, -1), 1, generator=g)
            ids = torch.cat([ids, top.indices[choice][None]], dim=1)
    return tok.decode(ids[0])


def load_data(data, gpt: GPTConfig) -> tuple[object, torch.Tensor, torch.Tensor]:
    """(tokenizer or None, train tokens, validation tokens) of the run's ``data`` section, the
    ids checked against the model's vocabulary. The tokenizer is None for pre-tokenized files
    with no ``data.tokenizer`` (and ids beyond bytes): there is nothing to decode a sample with."""
    if data is None or data.path is None:
        fraction = data.val_fraction if data is not None else 0.05
        tokenizer = sources.cached_tokenizer(data.tokenizer if data is not None else "byte")
        if isinstance(tokenizer, data_mod.ByteTokenizer):
            return (tokenizer, *data_mod.corpus_splits(fraction))
        tokens = tokenizer.encode_documents([data_mod.load_corpus()])
        return (tokenizer, *data_mod.split_tokens(tokens, fraction))
    tokenizer = sources.cached_tokenizer(data.tokenizer)
    train, val = sources.train_val_tokens(data, tokenizer)
    high = sources.check_vocabulary(train, gpt.vocab_size, "data.path")[1]
    sources.check_vocabulary(val, gpt.vocab_size, "data.val_path" if data.val_path else "data")
    if data.tokenizer == "byte" and high > 255:  # pre-tokenized ids beyond bytes
        tokenizer = None
    return tokenizer, train, val


def validation_stream(val: torch.Tensor, seq_len: int, rows: int, rank: int, world: int,
                      order: dict):  # fmt: skip
    """The eval batches' stream (in order, not shuffled; ``order``: the training stream's
    contiguous and batches_per_step); ValueError naming the keys to change when the validation
    tokens do not fill one global batch."""
    try:
        return data_mod.TokenStream(val, seq_len, rows, rank, world, 0, shuffle=False, **order)
    except ValueError as error:
        raise ValueError(
            f"the validation tokens are too few for one eval batch ({error}); raise "
            f"data.val_fraction, give a larger data.val_path, or lower the batch size"
        ) from None


def _checked_devices(device: torch.device, world: int, allow_mixed: bool) -> list[str]:
    """Every rank's device gathered once and compared (``device_check.py``): the start line,
    and the warning when mixed devices are allowed; DeviceMismatchError on every rank else."""
    descriptions: list = [None] * world
    dist.all_gather_object(descriptions, device_check.describe(device))
    warning = device_check.check(descriptions, allow_mixed)
    return [device_check.start_line(descriptions)] + ([warning] if warning else [])


def _local_world(world: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def compile_line(counts: dict) -> str:
    """The console's account of torch.compile after the first step."""
    breaks = counts["graph_breaks"]
    reasons = "".join(f"\n  {n}x {reason}" for reason, n in breaks.items())
    return (
        f"torch.compile: {counts['graphs']} graph(s), {sum(breaks.values())} graph break(s), "
        f"{counts['frames_not_compiled']} frame(s) left eager" + reasons
    )


def _comm_seconds() -> float:
    return _C.communication_seconds()
