# A DeepSpeed script hands its node-local rank to a helper under another name; the helper's
# guard on that parameter holds once per node, and every node writes the same export.
import argparse

import deepspeed
import torch


def export(engine, tokenizer, gpu):
    if gpu == 0:
        engine.module.save_pretrained("export")  # expect: GT017
        tokenizer.save_pretrained("export")  # expect: GT017


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed()
    model = torch.nn.Linear(2, 2)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    export(engine, None, args.local_rank)


if __name__ == "__main__":
    main()
