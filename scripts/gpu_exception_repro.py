"""One C++ exception path per mode, each run in its own process by scripts/gpu_diagnose.sh, so a
crash names the path it happened on. Prints 'MODE ok: <the Python error>' when the exception
reached Python as it should; a crash prints nothing more and the caller sees the signal.

Modes:
  torch_error     torch's own error (thrown in libtorch_cpu, caught in libtorch_python)
  op_error        a shardwise op's TORCH_CHECK (thrown in libshardwise, caught by torch's op call)
  pybind_error    an error thrown in libshardwise, caught in shardwise._C, re-raised as ValueError
  internal        thrown and caught inside libshardwise (the checkpoint agreement's start)
  *_cuda          the same after CUDA is initialised
"""

import sys
import tempfile


def main(mode: str) -> None:
    import torch

    if mode.endswith("_cuda"):
        torch.cuda.init()
        torch.ones(1, device="cuda")
        mode = mode[: -len("_cuda")]
    if mode == "torch_error":
        call = lambda: torch.ones(2) + torch.ones(3)  # noqa: E731
    else:
        import shardwise
        from shardwise import _C

        if mode == "op_error":
            call = lambda: shardwise.cast(torch.ones(2, dtype=torch.int32), torch.bfloat16)  # noqa: E731
        elif mode == "pybind_error":
            call = lambda: _C.set_cpu_isa("sse9")  # noqa: E731
        elif mode == "internal":
            folder = tempfile.mkdtemp()
            # An empty folder and a torn step folder: the agreement reads, refuses and goes on.
            import os

            os.makedirs(os.path.join(folder, "step-00000001"))
            with open(os.path.join(folder, "step-00000001", "manifest.json"), "w") as f:
                f.write("{not json")
            result = _C.checkpoint_agree(folder, 0, 1, None)
            print(f"{mode} ok: returned {result}", flush=True)
            return
        else:
            raise SystemExit(f"unknown mode {mode}")
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the point is which error arrives
        print(f"{mode} ok: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True)
        return
    print(f"{mode} WRONG: no error raised", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
