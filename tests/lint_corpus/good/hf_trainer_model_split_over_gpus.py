# A Trainer script that spreads one model over every visible GPU with a device map (naive
# model parallelism in one process). DDP cannot train such a model, so the script runs as a
# single process even though it passes the launcher's LOCAL_RANK through: its unguarded
# save_pretrained() is written once.
import os

from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def main(dataset):
    model = AutoModelForCausalLM.from_pretrained(
        "big-model",
        device_map={"model.embed_tokens": "cuda:0", "model.layers": "cuda:1", "lm_head": "cuda:1"},
    )
    args = TrainingArguments("out", local_rank=int(os.environ.get("LOCAL_RANK", -1)))
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    model.save_pretrained("final")


def main_auto(dataset):
    model = AutoModelForCausalLM.from_pretrained("big-model", device_map="auto")
    args = TrainingArguments("out2", local_rank=int(os.environ.get("LOCAL_RANK", -1)))
    Trainer(model=model, args=args, train_dataset=dataset).train()
    model.save_pretrained("final2")
