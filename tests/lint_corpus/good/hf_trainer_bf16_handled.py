# bf16 models under the Trainer where the trained weights keep an fp32 copy or are not the
# bf16 ones: DeepSpeed named in the arguments, an 8-bit optimizer, fp32 weights with bf16
# autocast, arguments from the command line (which may name DeepSpeed).
import torch
from transformers import (
    AutoModelForCausalLM,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)


def with_deepspeed(name, dataset):
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    args = TrainingArguments(output_dir="out", bf16=True, deepspeed="ds_zero2.json")
    Trainer(model=model, args=args, train_dataset=dataset).train()


def with_8bit_adam(name, dataset):
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    args = TrainingArguments(output_dir="out", bf16=True, optim="adamw_bnb_8bit")
    Trainer(model=model, args=args, train_dataset=dataset).train()


def fp32_weights(name, dataset):
    model = AutoModelForCausalLM.from_pretrained(name)
    args = TrainingArguments(output_dir="out", bf16=True)
    Trainer(model=model, args=args, train_dataset=dataset).train()


def from_command_line(name, dataset):
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    Trainer(model=model, args=args, train_dataset=dataset).train()
