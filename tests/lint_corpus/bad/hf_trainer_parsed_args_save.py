# A Hugging Face Trainer script whose training arguments come from the command line and that
# reads the rank they took from the launcher: it is written to be started once per GPU
# (torchrun / deepspeed). Its own save_pretrained() after trainer.train() then runs in every
# process, all writing the same adapter files (issue 33, sets 8 and 10). A save in dead code
# (`if False:`) runs nowhere.
import logging
from dataclasses import dataclass, field

import transformers
from peft import LoraConfig, get_peft_model
from transformers import HfArgumentParser, Trainer, TrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="gpt2")


def train():
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    logger.warning(f"rank {training_args.local_rank}, world {training_args.world_size}")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    model = get_peft_model(model, LoraConfig(r=8, task_type="CAUSAL_LM"))
    trainer = Trainer(model=model, args=training_args, train_dataset=load_data())
    trainer.train()
    trainer.model.save_pretrained("lora-adapter")  # expect: GT007
    if False:
        merged = model.merge_and_unload()
        merged.save_pretrained("merged")


if __name__ == "__main__":
    train()
