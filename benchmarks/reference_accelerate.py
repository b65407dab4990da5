"""The reference recipe from diffusers' distributed-inference docs, for runtime_throughput.py.

    accelerate launch --multi_gpu --num_processes 2 benchmarks/reference_accelerate.py \
        --model DIR --prompts FILE --output DIR --steps 4 --height 256 --width 256 ...

accelerate's `PartialState` with `split_between_processes`, one pipeline call per prompt,
each image saved as PNG by the process that rendered it. Seeds are those the runtime uses
(base seed + prompt index, one CPU generator per image), so both sides render the same images.
The benchmark times this side's pipeline calls as it times the runtime's (call_times/sitecustomize.py).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of prompt strings")
    parser.add_argument("--output", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--height", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--guidance-scale", type=float, required=True)
    parser.add_argument("--max-sequence-length", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from accelerate import PartialState
    from diffusers import FluxPipeline

    out = Path(args.output)
    prompts: list[str] = json.loads(Path(args.prompts).read_text())
    # On a CPU box `--multi_gpu` starts the processes and PartialState(cpu=True) joins them
    # with gloo (measured here: without --multi_gpu accelerate starts one process only).
    state = PartialState(cpu=True)
    pipe = FluxPipeline.from_pretrained(args.model, dtype=torch.float32)
    pipe.to(state.device)
    pipe.set_progress_bar_config(disable=True)  # the runtime disables its bars too
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    state.wait_for_everyone()

    with state.split_between_processes(list(range(len(prompts)))) as indexes:
        for p in indexes:
            image = pipe(
                prompts[p],
                num_inference_steps=args.steps,
                guidance_scale=args.guidance_scale,
                height=args.height,
                width=args.width,
                max_sequence_length=args.max_sequence_length,
                generator=torch.Generator("cpu").manual_seed(args.seed + p),
            ).images[0]
            image.save(out / f"{p:05d}-000.png")  # the runtime's file names
    state.wait_for_everyone()
    if os.environ.get("BENCH_VERBOSE"):
        print(f"rank {state.process_index}: {len(indexes)} images, "
              f"{torch.get_num_threads()} threads", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
