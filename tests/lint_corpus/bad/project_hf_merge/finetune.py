import argparse

from accelerate import Accelerator
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from merge import merge_adapter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="gpt2")
    parser.add_argument("--output_dir", default="out")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(
        args.base, device_map={"": Accelerator().local_process_index}
    )
    trainer = Trainer(model=model, args=TrainingArguments(args.output_dir))
    trainer.train()
    if trainer.is_world_process_zero():
        trainer.model.save_pretrained(args.output_dir)
    merge_adapter(args.base, args.output_dir)  # expect: GT007 (the call: every rank merges and saves)


if __name__ == "__main__":
    main()
