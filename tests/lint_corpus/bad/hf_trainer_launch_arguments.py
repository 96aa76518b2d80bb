# A Hugging Face Trainer script that takes the launcher's rank and a DeepSpeed config (issue 33,
# round 6): torchrun/deepspeed run it once per GPU, so the save after train() is every rank's.
from dataclasses import dataclass, field

from transformers import AutoModelForSequenceClassification, HfArgumentParser, Trainer
from transformers import TrainingArguments


@dataclass
class ScriptArguments:
    local_rank: int = field(default=-1)
    deepspeed: str = field(default=None)
    output_dir: str = field(default="out")


script_args = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses()[0]
model = AutoModelForSequenceClassification.from_pretrained("gpt2", num_labels=1)
training_args = TrainingArguments(
    output_dir=script_args.output_dir,
    deepspeed=script_args.deepspeed,
    local_rank=script_args.local_rank,
)
trainer = Trainer(model=model, args=training_args)
trainer.train()
model.save_pretrained(script_args.output_dir + "last_checkpoint")  # expect: GT007
