"""The planner's prediction against the committed H200 runs (no GPU needed): each run's own
configuration (a shardwise-train config and overrides: the model, batch, sequence, FSDP's
precision) planned on this machine on fake tensors and priced at the H200's rates
(``calibration.gpu_rates``), beside the step and peak GPU memory the run measured
(``benchmarks/results/2026-11-26-fsdp-*gpu-h200.md``: the median step of one process,
torch.cuda.max_memory_allocated). ``tests/python/test_prediction_h200.py`` asserts the rows.

Run: python benchmarks/bench_planner_h200.py --output benchmarks/results/DATE-planner-h200.md
"""

import argparse
import datetime
import sys
from pathlib import Path

from report import emit, table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ROOT / "examples" / "configs"
# transformers LlamaForCausalLM sized like GPT 1b, as bench_fsdp.py --llama builds it
LLAMA = [
    "model.hf_overrides.hidden_size=2048",
    "model.hf_overrides.intermediate_size=5632",
    "model.hf_overrides.num_hidden_layers=18",
    "model.hf_overrides.num_attention_heads=16",
    "model.hf_overrides.num_key_value_heads=16",
    "model.hf_overrides.vocab_size=32768",
    "model.hf_overrides.max_position_embeddings=2048",
    "model.hf_overrides.tie_word_embeddings=false",
    "data.seq_len=2048",
    "training.micro_batch_size=4",
]
GPT_SMALL = ["model.preset=small", "training.micro_batch_size=8",
             "training.gradient_checkpointing=false"]  # fmt: skip
# the results' rows: shardwise = bf16 autocast over fp32 parameters; shardwise-mp = FSDP's own
# mixed precision (bf16 parameters, no autocast)
MIXED = {"shardwise": "false", "shardwise-mp": "true"}
RUNS = {
    # name: (results table, config, overrides, the config's FSDP mixed-precision key)
    "GPT small": ("2026-11-26-fsdp-gpu-h200.md", "fsdp.yaml", GPT_SMALL,
                  "distributed.fsdp_mixed_precision"),
    "Llama 1.1B": ("2026-11-26-fsdp-llama-1b-gpu-h200.md", "hf_llama.yaml", LLAMA,
                   "distributed.fsdp.fsdp_mixed_precision"),
}  # fmt: skip


def measured(results: str, framework: str) -> tuple[float, float]:
    """(step s, peak GPU allocated MiB) of ``framework``'s row in a committed results table."""
    for line in (RESULTS / results).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == framework:
            return float(cells[1]), float(cells[5])
    raise ValueError(f"no row {framework!r} in {results}")


def predicted(run: str, framework: str) -> dict:
    """The prediction's ``predicted`` for ``run``'s configuration with ``framework``'s
    precision, on one H200."""
    from shardwise.train import config_plan, prediction
    from shardwise.train.config import load_config

    _, config, overrides, key = RUNS[run]
    mp = f"{key}={MIXED[framework]}"
    cfg = load_config(CONFIGS / config, [*overrides, "training.mixed_precision=bf16", mp],
                      env={"WORLD_SIZE": "1"})  # fmt: skip
    plan = config_plan.plan_for_config(cfg, 141 * 2**30)
    return prediction.for_config(cfg, plan, "h200").predicted


HEAD = ["run", "row", "predicted step s", "measured step s", "error", "predicted peak MiB",
        "measured peak MiB", "error"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rows = []
    for run, (results, *_) in RUNS.items():
        for framework in MIXED:
            step, peak = measured(results, framework)
            p = predicted(run, framework)
            mine, memory = p["step_s"], p["peak_device_mb_per_rank"]
            rows.append([run, framework, f"{mine:.4g}", f"{step:.4g}",
                         f"{(mine - step) / step:+.0%}", f"{memory:.0f}", f"{peak:.0f}",
                         f"{(memory - peak) / peak:+.0%}"])  # fmt: skip
    lines = [
        f"# Predicted against measured: the committed H200 runs ({datetime.date.today()})",
        "",
        f"- command: `python benchmarks/bench_planner_h200.py {' '.join(sys.argv[1:])}`",
        "- measured: the H200 lease of 2026-11-26 (FSDP over one GPU, the results tables named "
        "in the script); predicted: the same configuration planned on a CPU machine, on fake "
        "tensors, at the H200's rates",
        "- rows: shardwise = bf16 autocast over fp32 parameters; shardwise-mp = FSDP's own "
        "mixed precision (bf16 parameters)",
        "",
        *table(HEAD, rows),
    ]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
