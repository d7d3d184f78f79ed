"""FSDP training benchmark on CPU: the bundled GPT (``small``: ~23M parameters, sequence 256)
at world 2, shardwise FSDP (full_shard) beside torch FSDP2 (``fully_shard`` over gloo) and torch
DDP (gloo), in the same run, each in its own processes.

Every framework trains the same model from the same initialization on the same batches, with
bf16 autocast (``torch.autocast("cpu", torch.bfloat16)``) and fp32 parameters, AdamW; a second
pair of rows uses each FSDP's own mixed precision instead (bf16 parameters gathered, fp32
gradient reduction). Reported per framework: step time (median of the timed steps, max over
ranks), tokens/s (all ranks), peak RSS per rank (``ru_maxrss``, includes the Python/torch
baseline, measured in fresh processes) and model-state bytes per rank counted from tensor
storages (parameters + gradients + optimizer state), and the loss after the last step.

``fsdp2-sw`` is torch FSDP2 over the shardwise backend: the two FSDP engines on the same transport.
``fully_shard`` rows are ``shardwise.fully_shard`` (FSDP2's API, the same calls per block and at
the root) over the shardwise backend: against ``fsdp2-sw`` on the same backend, against ``fsdp2``
each on its default one. ``compute`` is the limit: one process training the unwrapped model on one
rank's batch (the same per-rank batch, no communication, no sharding); "limit / step" is its step
time over each row's. ``--hf`` trains a Hugging Face ``transformers`` GPT-2 sized like the preset
(its ``GPT2Block`` layers are the units of both FSDPs) instead of the bundled GPT; ``--llama`` a
transformers ``LlamaForCausalLM`` of the preset's sizes (``1b``: ~1.1B parameters). On cuda the
table adds MFU against the bf16 matmul rate measured in the same run.

On ``--device cuda`` each rank trains on cuda:LOCAL_RANK (so --world is at most the number of
GPUs); shardwise runs over its own backend (CUDA tensors through its NCCL communicator), torch
over NCCL, and peak memory is the GPU's peak allocated bytes instead of RSS.

Run: python benchmarks/bench_fsdp.py --output benchmarks/results/DATE-fsdp-cpu.md
     python benchmarks/bench_fsdp.py --device cuda --world 1 --output DATE-fsdp-gpu.md
"""

import argparse
import datetime
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import emit

FRAMEWORKS = ("shardwise", "fsdp2", "ddp", "shardwise-mp", "fsdp2-mp", "compute")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_bytes(model, optimizer) -> int:
    import torch

    seen, total = set(), 0
    tensors = [p for p in model.parameters()] + [
        p.grad for p in model.parameters() if p.grad is not None
    ]
    for state in optimizer.state.values():
        tensors += [t for t in state.values() if torch.is_tensor(t) and t.dim() > 0]
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def hf_gpt2(cfg):
    """A transformers GPT-2 with the preset's sizes, no dropout, behind the GPT's interface."""
    from shardwise.models.causal_lm import CausalLM
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.seq_len, n_embd=cfg.dim, n_layer=cfg.layers,
        n_head=cfg.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return CausalLM(GPT2LMHeadModel(config))


def llama_config(cfg):
    """A Llama-style transformers config with the preset's width, depth, heads, vocabulary and
    sequence (RMSNorm, rotary positions, SwiGLU of width 8/3 x dim rounded up to 256, untied
    embeddings): the ``1b`` preset gives about 1.1B parameters."""
    from transformers import LlamaConfig

    hidden = -(-8 * cfg.dim // 3 // 256) * 256
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=hidden,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        max_position_embeddings=cfg.seq_len, tie_word_embeddings=False,
    )  # fmt: skip


def hf_llama(cfg):
    """A transformers LlamaForCausalLM (``llama_config``) behind the GPT's interface."""
    from shardwise.models.causal_lm import CausalLM
    from transformers import LlamaForCausalLM

    return CausalLM(LlamaForCausalLM(llama_config(cfg)))


def build_model(cfg, args):
    from shardwise.models import GPT

    if args.llama:
        return hf_llama(cfg)
    return hf_gpt2(cfg) if args.hf else GPT(cfg)


def wrap_names(cfg, args) -> list[str]:
    """The transformer layers' names: the units of both FSDPs."""
    if args.llama:
        return [f"inner.model.layers.{i}" for i in range(cfg.layers)]
    prefix = "inner.transformer.h" if args.hf else "blocks"
    return [f"{prefix}.{i}" for i in range(cfg.layers)]


def run_rank(framework: str, args) -> None:
    import shardwise
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from shardwise.models import PRESETS

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if framework.startswith(("shardwise", "fsdp2-sw", "fully_shard")):
        backend = "cpu:shardwise,cuda:shardwise" if cuda else "shardwise"
    else:
        backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    torch.manual_seed(0)
    with device:  # built where it trains (a 1B model's CPU initialization takes long)
        model = build_model(cfg, args).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    mixed = framework.endswith("-mp")
    if framework.startswith("fully_shard"):  # FSDP2's API, shardwise's engine
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if mixed else None
        extra = {"mp_policy": policy} if policy else {}
        for name in wrap_names(cfg, args):
            shardwise.fully_shard(model.get_submodule(name), **extra)
        shardwise.fully_shard(model, **extra)
    elif framework.startswith("shardwise"):
        kwargs = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32} if mixed else {}
        model = shardwise.FullyShardedDataParallel(model, wrap=wrap_names(cfg, args), **kwargs)
    elif framework == "compute":
        pass  # one process, the plain model: the compute-only limit
    elif framework.startswith("fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if mixed else None
        extra = {"mp_policy": policy} if policy else {}
        for name in wrap_names(cfg, args):
            fully_shard(model.get_submodule(name), mesh=mesh, **extra)
        fully_shard(model, mesh=mesh, **extra)
    else:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None
        )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(1)
    times, loss = [], None
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(
            0, cfg.vocab_size, (args.batch * args.world, cfg.seq_len + 1), generator=g
        )
        tokens = tokens[rank * args.batch : (rank + 1) * args.batch].to(device)
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        autocast = not mixed and not args.fp32
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(
            logits.float().reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    state = state_bytes(model, opt)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if cuda:  # the GPU's peak, not the host's
        peak_rss = torch.cuda.max_memory_allocated(device)
    step_time = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(step_time, op=dist.ReduceOp.MAX)
    stats = torch.tensor([peak_rss, state], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    final = torch.tensor([loss.item()], dtype=torch.float64, device=device)
    dist.all_reduce(final)
    if rank == 0:
        result = {
            "framework": framework,
            "step_s": step_time.item(),
            "tokens_per_s": args.batch * world * cfg.seq_len / step_time.item(),
            "peak_rss": stats[0].item(),
            "state_bytes": stats[1].item(),
            "loss": final.item() / world,
            "parameters": parameters,
        }
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(framework: str, args, script: str = __file__) -> dict:
    """Runs `script --rank-of framework` on args.world ranks; rank 0's last JSON line."""
    port = free_port()
    procs = []
    world = 1 if framework == "compute" else args.world
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            OMP_NUM_THREADS="1",
        )
        argv = [sys.executable, script, "--rank-of", framework] + sys.argv[1:]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{framework} failed: {[p.returncode for p in procs]}")
    return json.loads(outputs[0].strip().splitlines()[-1])


def model_name(args) -> str:
    if args.llama:
        return "transformers LlamaForCausalLM sized like GPT"
    return "transformers GPT2LMHeadModel sized like GPT" if args.hf else "GPT"


def mfu(result: dict, cfg, args, peak_tflops: float) -> float:
    """Model FLOPs utilization of one GPU, with the trainer's FLOPs per token
    (``shardwise.train.metrics.flops_per_token``)."""
    from shardwise.train.metrics import flops_per_token

    gpus = 1 if result["framework"] == "compute" else args.world
    per_token = flops_per_token(result["parameters"], cfg.layers, cfg.seq_len, cfg.dim)
    return result["tokens_per_s"] / gpus * per_token / (peak_tflops * 1e12)


def table(results: list[dict], args) -> list[str]:
    from shardwise.models import PRESETS

    base = {r["framework"]: r for r in results}
    torch = __import__("torch")
    cuda = args.device == "cuda"
    where = torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine()
    memory = "peak GPU allocated MB/rank" if cuda else "peak RSS MB/rank"
    lines = [
        f"# FSDP training on {args.device}: shardwise vs torch FSDP2 vs DDP "
        f"({datetime.date.today()})",
        "",
        f"- machine: {where}, {os.cpu_count()} CPU cores; torch {torch.__version__}",
        f"- command: `python benchmarks/bench_fsdp.py {' '.join(sys.argv[1:])}`",
        f"- model: {model_name(args)} `{args.model}` ({results[0]['parameters'] / 1e6:.1f}M "
        f"parameters, sequence {PRESETS[args.model].seq_len}), batch {args.batch} per rank, "
        f"world {args.world}, AdamW, {args.steps} timed steps after {args.warmup} warm-up"
        + (
            f", {args.repeats} interleaved rounds (the median round per row)"
            if args.repeats > 1
            else ""
        ),
        "- rows without -mp: "
        + ("fp32 compute (no autocast)" if args.fp32 else "bf16 autocast, fp32 parameters")
        + "; -mp rows: the FSDP's own mixed precision (bf16 parameters, fp32 gradient "
        "reduction), no autocast",
        "- each on its default backend: shardwise over shardwise, torch over "
        + ("NCCL" if cuda else "gloo")
        + "; fsdp2-sw: torch FSDP2 over the shardwise backend (the engines alone)",
        "- peak RSS includes the ~0.4 GB Python/torch baseline of each process"
        if not cuda
        else "- peak GPU memory: torch.cuda.max_memory_allocated",
        "",
        "| framework | step s | tokens/s | tokens/s vs fsdp2 | vs fsdp2-sw | tokens/s vs ddp | "
        + memory
        + " | model state MB/rank | final loss | limit / step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    limit = base.get("compute")
    peak = None
    if cuda:  # the trainer's MFU denominator: an 8192^3 bf16 matmul on this GPU
        from shardwise.train.metrics import measured_peak_flops

        peak = measured_peak_flops(torch.bfloat16, 8192, torch.device("cuda", 0)) / 1e12
    if peak:
        lines[-2] = lines[-2] + " MFU |"
        lines[-1] = lines[-1] + "---:|"
    for r in results:
        suffix = "-mp" if r["framework"].endswith("-mp") else ""
        anchor = base.get("fsdp2" + suffix, r)
        same = base.get("fsdp2-sw" + suffix)
        versus_same = f"{r['tokens_per_s'] / same['tokens_per_s']:.2f}x" if same else "–"
        bound = f"{limit['step_s'] / r['step_s']:.2f}" if limit else "–"
        lines.append(
            f"| {r['framework']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | "
            f"{r['tokens_per_s'] / anchor['tokens_per_s']:.2f}x | {versus_same} | "
            f"{r['tokens_per_s'] / base.get('ddp', r)['tokens_per_s']:.2f}x | "
            f"{r['peak_rss'] / 2**20:.0f} | {r['state_bytes'] / 2**20:.1f} | {r['loss']:.4f} | "
            f"{bound} |" + (f" {mfu(r, PRESETS[args.model], args, peak):.1%} |" if peak else "")
        )
    if peak:
        lines += [
            "",
            f"MFU: tokens/s per GPU x training FLOPs per token (6 x parameters + 12 x layers x "
            f"width x sequence) over the bf16 matmul rate measured on this GPU in the same run "
            f"(8192^3: {peak:.0f} TFLOP/s).",
        ]
    if limit:
        lines += [
            "",
            "compute: one process training the plain model on one rank's batch (no "
            "communication, no sharding): the limit; its tokens/s are one process's.",
        ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--fp32", action="store_true", help="no autocast: fp32 compute")
    parser.add_argument("--hf", action="store_true", help="a transformers GPT-2 of that size")
    parser.add_argument(
        "--llama", action="store_true", help="a transformers Llama of that size (1b: ~1.1B)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds (median)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not args.rank_of:
        import torch

        if args.world > torch.cuda.device_count():
            parser.error(
                f"--world {args.world} on --device cuda needs as many GPUs; this machine has "
                f"{torch.cuda.device_count()}: pass --world {max(torch.cuda.device_count(), 1)}"
            )
    if args.rank_of:
        run_rank(args.rank_of, args)
        return 0
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):  # interleaved rounds; each row is the median round's
        for framework in args.frameworks.split(","):
            runs.setdefault(framework, []).append(launch(framework, args))
            print(json.dumps(runs[framework][-1]), file=sys.stderr, flush=True)
    results = [sorted(r, key=lambda x: x["step_s"])[len(r) // 2] for r in runs.values()]
    emit(table(results, args), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
