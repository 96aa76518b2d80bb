# The same kind of script, launched once per GPU, with its own save made by the world's
# process zero only (and the Trainer's save_model, which guards itself).
from transformers import HfArgumentParser, Trainer, TrainingArguments


def main(model, dataset):
    (training_args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    print(f"process {training_args.process_index} of {training_args.world_size}")
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        model.save_pretrained(training_args.output_dir + "/adapter")
