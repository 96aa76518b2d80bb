# Hugging Face Trainer with save_on_each_node=True (issue 33, round 8): the Trainer writes its
# checkpoints on the local main process of every node, all into the same output_dir.
import argparse

from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--output_dir", default="out")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained("gpt2")
    train_args = TrainingArguments(
        output_dir=args.output_dir,
        local_rank=args.local_rank,
        save_steps=50,
        save_on_each_node=True,  # expect: GT017
    )
    trainer = Trainer(model=model, args=train_args, train_dataset=None)
    trainer.train()


if __name__ == "__main__":
    main()
