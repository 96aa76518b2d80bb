# A model loaded (or converted) in bf16 handed to the Hugging Face Trainer, whose optimizer is
# torch's AdamW: bf16=True only adds autocast, so the bf16 weights are stepped with no fp32
# master copy.
import torch
from transformers import (
    AutoModelForCausalLM,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainingArguments,
)


class LoggingTrainer(Trainer):
    def log(self, logs, *args, **kwargs):
        super().log(logs, *args, **kwargs)


def pretrain(name, dataset):
    auto = AutoModelForCausalLM
    model = auto.from_pretrained(name, dtype=torch.bfloat16)  # expect: GT019
    args = TrainingArguments(output_dir="out", bf16=True, optim="adamw_torch_fused")
    LoggingTrainer(model=model, args=args, train_dataset=dataset).train()


def translate(build, dataset):
    net = build().to(torch.bfloat16)  # expect: GT019
    settings = Seq2SeqTrainingArguments("out", learning_rate=3e-5, bf16=True)
    trainer = Seq2SeqTrainer(net, settings, train_dataset=dataset)
    trainer.train()
