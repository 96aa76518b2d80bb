# A Hugging Face Trainer script written for torchrun: it reads the launcher's WORLD_SIZE and
# LOCAL_RANK from the environment, so every process runs it from the top. Its own writes are
# guarded by the node-local rank (`or 0` when unset): one writer per node, same paths.
import json
import os

import transformers


def train(model, dataset, output_dir="out"):
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    ddp = world_size != 1
    if int(os.environ.get("LOCAL_RANK") or 0) == 0:
        with open(os.path.join(output_dir, "params.json"), "w") as f:  # expect: GT017
            json.dump({"world_size": world_size}, f)
    args = transformers.TrainingArguments(
        output_dir=output_dir,
        ddp_find_unused_parameters=False if ddp else None,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    if int(os.environ.get("LOCAL_RANK") or 0) == 0:
        model.save_pretrained(output_dir)  # expect: GT017
