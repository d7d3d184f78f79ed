"""The training loop of ``shardwise-train``.

``Trainer(spec).run()``: set up the process group, check the memory plan, apply the parallelism
transforms to identically initialized models and make the one train step over them
(``step.build``), resume from the newest intact checkpoint, then per step: draw the
gradient-accumulation micro-batches of this data rank, step with the scheduled learning rate,
log the metrics, and checkpoint every ``checkpoint_every`` steps and on SIGTERM or SIGINT (then
stop). At the end: a last checkpoint, the full model as safetensors, a text sample.

A checkpoint holds, per rank: the strategy's world-size-independent pieces (or ZeRO's own), the
optimizer step, this rank's RNG state and the data position; the manifest holds the config.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from .. import _C
from ..models.causal_lm import export_names
from ..models.gpt import GPT, GPTConfig
from . import checkpoint as ckpt
from . import data as data_mod
from . import device as device_mod
from . import metrics, pieces, sources
from . import step as step_mod
from .parallelize import StrategyOptions


@dataclass
class RunSpec:
    """Everything the loop needs, resolved from the config (``config.py``)."""

    gpt: GPTConfig
    strategy: str  # ddp | fsdp | zero | pipeline
    options: StrategyOptions
    micro_batch_size: int = 4
    accumulation: int = 1
    learning_rate: float = 3e-4  # already scaled for the effective batch size
    warmup_steps: int = 10
    max_steps: int = 100
    data_seed: int = 0  # the order of the batches (data.shuffle_seed, else training.seed)
    backend: str = "shardwise"  # a name or a device:name list (cpu:shardwise,cuda:nccl)
    device: str = "cpu"  # cpu or cuda (config.py resolved training.device)
    local_rank: int = 0
    # the job's place from the config (torchrun's variables win): WORLD_SIZE, RANK, LOCAL_RANK,
    # LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; None: not given
    layout: dict = field(default_factory=dict)
    timeout_s: float | None = None  # a collective's limit (distributed.timeout_s); None: torch's
    output_dir: Path = Path("outputs/run")
    checkpoint_every: int = 50
    keep_last: int = 3
    resume: bool = True
    log_every: int = 1
    eval_every: int = 0  # steps between eval losses on the validation tokens (0: only at the end)
    eval_batches: int = 4
    profile_communication: bool = False  # log the backend's operations per step
    profile: dict | None = None  # torch.profiler's schedule: wait, warmup, active steps
    data: object = None  # config.DataSection (None: the bundled corpus, byte tokens)
    sample_tokens: int = 200
    config_yaml: str = ""
    effective_batch_size: int = 0
    memory_note: str = ""
    extra: dict = field(default_factory=dict)


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
        if "shardwise" in backend:
            import shardwise  # noqa: F401  (registers the backend)
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def lr_at(step: int, spec: RunSpec) -> float:
    """Linear warm-up to the peak, then cosine decay to 10% of it at max_steps (the C++
    ``training/lr_schedule.h``, which the LibTorch trainer reads too)."""
    return _C.warmup_cosine_lr(step, spec.learning_rate, spec.warmup_steps, spec.max_steps)


class Trainer:
    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.device = device_mod.local_device(spec.device, spec.local_rank)  # before NCCL starts
        self.rank, self.world = init_distributed(spec.backend, spec.layout, spec.timeout_s)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // _local_world(self.world)))
        self.stepper = step_mod.build(spec.strategy, spec.options, self.world)
        group = self.stepper.data_group
        self.data_rank = dist.get_rank(group) if group is not None else 0
        self.data_world = dist.get_world_size(group) if group is not None else 1
        rows = spec.micro_batch_size
        if spec.strategy == "pipeline":  # the pipeline cuts its batch into microbatches
            rows *= int(spec.options.pipeline.get("num_microbatches", 1))
        self.tokenizer, train_tokens, val_tokens = load_data(spec)
        self.stream = data_mod.TokenStream(
            train_tokens, spec.gpt.seq_len, rows, self.data_rank, self.data_world, spec.data_seed
        )
        self.val_stream = validation_stream(val_tokens, spec, rows, self.data_rank, self.data_world)
        self.stream_rows = rows
        self.step = 0
        self._slow, self._slow_streak = None, 0
        self.sinks = metrics.Sinks(spec.output_dir, spec.max_steps, 0, self.rank == 0)

    # --- checkpoints -----------------------------------------------------------------------

    def _payload(self) -> dict:
        s = self.stepper
        payload = {
            "step": self.step,
            "optimizer_step": s.optimizer_step_count(),
            "rng": torch.get_rng_state(),
            "data": self.stream.state(),
        }
        if s.engine is not None:  # ZeRO's own pieces
            payload["zero"] = s.payload()
        else:
            payload["pieces"] = pieces.to_pieces(s.save_slots())
            payload["scaler"] = s.scaler_state()
        return payload

    def save(self) -> Path:
        return ckpt.save(
            self.spec.output_dir / "checkpoints",
            self.step,
            self._payload(),
            self.rank,
            self.world,
            self.spec.config_yaml,
            self.spec.keep_last,
        )

    def _agreed_checkpoint(self) -> Path | None:
        """The checkpoint every rank resumes from: rank 0 chooses, after removing killed writes'
        temporary files, and broadcasts its step (C++ ``agree_on_checkpoint``: ranks choosing
        alone could disagree, as the fault soak found)."""

        def broadcast_step(step: int) -> int:
            chosen = torch.tensor([step], dtype=torch.int64, device=self.device)
            dist.broadcast(chosen, src=0)
            return int(chosen.item())

        path, removed, skipped = ckpt.agree(
            self.spec.output_dir / "checkpoints",
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
        self.stream.load_state(payloads[0]["data"])
        self.step = int(payloads[0]["step"])
        self.sinks.note(f"resumed from {path} (step {self.step}, saved by {saved_world} ranks)")
        return True

    # --- the loop --------------------------------------------------------------------------

    def run(self) -> dict:
        spec = self.spec
        if spec.resume:
            self.resume()
        if self.sinks.bar is not None:
            self.sinks.bar.n = self.step
        self.sinks.note(
            f"strategy {spec.strategy}, world {self.world}, effective batch "
            f"{spec.effective_batch_size} sequences of {spec.gpt.seq_len} tokens"
            + (f"\nmesh: {self.stepper.mesh_description}" if self.stepper.mesh_description else "")
            + (f"\n{spec.memory_note}" if spec.memory_note else "")
        )
        flops_token = metrics.flops_per_token(
            spec.gpt.num_parameters(), spec.gpt.layers, spec.gpt.seq_len, spec.gpt.dim
        )
        peak = self._peak_flops()
        stop = ckpt.install_sigterm_handler((signal.SIGTERM, signal.SIGINT))
        self._first_step = self.step + 1
        last = {}
        cuda = self.device.type == "cuda"
        profiler = metrics.StepProfiler(spec.profile, spec.output_dir, self.rank, cuda)
        try:
            while self.step < spec.max_steps and not stop.requested:
                last = self._one_step(flops_token, peak)
                profiler.step()
                every = spec.eval_every
                if (every and self.step % every == 0) or self.step == spec.max_steps:
                    last["val_loss"] = self.evaluate()
                if self.step % spec.log_every == 0 or self.step == spec.max_steps:
                    self.sinks.write(last)
                if self.step % spec.checkpoint_every == 0 or stop.requested:
                    self.save()
        finally:
            profiler.close()
            stop.close()
        if stop.requested:
            name = signal.Signals(stop.signum).name
            self.sinks.note(f"{name}: saved step {self.step}; stopping")
        else:
            self.save()
            last.update(self._finish())
        self.sinks.close()
        return last

    def _peak_flops(self) -> float:
        """The MFU denominator: on a GPU its data-sheet bf16 peak (measured when not listed), on
        the CPU a matmul measured in the training dtype."""
        if self.device.type == "cuda":
            listed = device_mod.bf16_peak(torch.cuda.get_device_name(self.device))
            return listed or metrics.measured_peak_flops(torch.bfloat16, device=self.device)
        return metrics.measured_peak_flops(
            torch.bfloat16 if self.spec.options.bf16 else torch.float32
        )

    def _one_step(self, flops_token: float, peak: float) -> dict:
        spec = self.spec
        start = time.perf_counter()
        batches = [next(self.stream) for _ in range(spec.accumulation)]
        batches = [device_mod.to_device(b, self.device) for b in batches]
        data_s = time.perf_counter() - start
        self.step += 1
        lr = lr_at(self.step, spec)
        comm0, ops0 = _comm_seconds(), self._comm_stats()
        start = time.perf_counter()
        out = self.stepper.train_step(batches, lr)
        seconds = time.perf_counter() - start
        comm, ops1 = _comm_seconds() - comm0, self._comm_stats()  # before the metrics' gathers
        gpu = device_mod.gpu_memory_mb(self.device)  # [] on the CPU
        mine = {"step": seconds, "comm": comm, "rss": float(metrics.peak_rss_bytes())}
        mine.update(data=data_s, **self.stepper.phase_seconds)
        if gpu:  # allocated, reserved, peak
            mine.update(zip(("gpu_allocated", "gpu_reserved", "gpu_peak"), gpu, strict=True))
        per_rank = metrics.gather_dicts(mine)  # the step's one collective for the metrics
        step_s = max(r["step"] for r in per_rank)
        tokens = spec.effective_batch_size * spec.gpt.seq_len
        replica = self.stream_rows * spec.accumulation * spec.gpt.seq_len  # the same on every rank
        record = {
            "step": self.step,
            "loss": out["loss"],
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
            if spec.backend == "shardwise"
            else None,
            "peak_rss_mb_per_rank": [round(r["rss"] / 2**20, 1) for r in per_rank],
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

    def _comm_stats(self) -> dict | None:
        """The shardwise backend's counters when training.profile_communication is on."""
        if not self.spec.profile_communication:
            return None
        from .. import _C

        return _C.communication_stats()

    def evaluate(self) -> float:
        """The eval loss over the first ``eval_batches`` validation batches (the same ones every
        time, so the values are comparable; collective)."""
        n = min(self.spec.eval_batches, self.val_stream.batches_per_epoch)
        batches = [self.val_stream.batch(0, i) for i in range(n)]
        return self.stepper.eval_loss([device_mod.to_device(b, self.device) for b in batches])

    def _finish(self) -> dict:
        """The full model as safetensors (a Hugging Face model's with its config.json, so
        ``from_pretrained`` loads the folder) and a text sample (rank 0)."""
        state = {k: v.cpu() for k, v in self.stepper.full_state_dict().items()}
        result = {}
        if self.rank == 0:
            path = self.spec.output_dir / "model.safetensors"
            build = self.spec.options.build
            ckpt.export_safetensors(state if build is None else export_names(state), path)
            if build is not None and build.config() is not None:
                build.config().to_json_file(str(self.spec.output_dir / "config.json"))
            result["safetensors"] = str(path)
            if self.tokenizer is not None:
                text = sample(state, self.spec.gpt, self.spec.sample_tokens, self.tokenizer, build)
                result["sample"] = text
                self.sinks.note(f"wrote {path}\nsample:\n{text}")
            else:
                self.sinks.note(f"wrote {path} (no sample: give data.tokenizer to decode one)")
        dist.barrier()
        return result


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


def load_data(spec: RunSpec) -> tuple[object, torch.Tensor, torch.Tensor]:
    """(tokenizer or None, train tokens, validation tokens) of the run's ``data`` section, the
    ids checked against the model's vocabulary. The tokenizer is None for pre-tokenized files
    with no ``data.tokenizer`` (and ids beyond bytes): there is nothing to decode a sample with."""
    data = spec.data
    if data is None or data.path is None:
        fraction = data.val_fraction if data is not None else 0.05
        tokenizer = sources.cached_tokenizer(data.tokenizer if data is not None else "byte")
        if isinstance(tokenizer, data_mod.ByteTokenizer):
            return (tokenizer, *data_mod.corpus_splits(fraction))
        tokens = tokenizer.encode_documents([data_mod.load_corpus()])
        return (tokenizer, *data_mod.split_tokens(tokens, fraction))
    tokenizer = sources.cached_tokenizer(data.tokenizer)
    train, val = sources.train_val_tokens(data, tokenizer)
    high = sources.check_vocabulary(train, spec.gpt.vocab_size, "data.path")[1]
    sources.check_vocabulary(val, spec.gpt.vocab_size, "data.val_path" if data.val_path else "data")
    if data.tokenizer == "byte" and high > 255:  # pre-tokenized ids beyond bytes
        tokenizer = None
    return tokenizer, train, val


def validation_stream(val: torch.Tensor, spec: RunSpec, rows: int, rank: int, world: int):
    """The eval batches' stream (in order, not shuffled); ValueError naming the keys to change
    when the validation tokens do not fill one global batch."""
    try:
        return data_mod.TokenStream(val, spec.gpt.seq_len, rows, rank, world, 0, shuffle=False)
    except ValueError as error:
        raise ValueError(
            f"the validation tokens are too few for one eval batch ({error}); raise "
            f"data.val_fraction, give a larger data.val_path, or lower the batch size"
        ) from None


def _local_world(world: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def _comm_seconds() -> float:
    from .. import _C

    return _C.communication_seconds()
