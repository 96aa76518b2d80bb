# Hugging Face Trainer scripts and their saves after train() (issue 33, round 6): one that
# takes no launcher rank (a one-GPU script), and one launched per GPU that saves on the
# main process only.
from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments


def train_one_gpu(output_dir):
    model = AutoModelForSequenceClassification.from_pretrained("gpt2", num_labels=1)
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=output_dir))
    trainer.train()
    model.save_pretrained(output_dir + "/last")


def train_launched(output_dir, local_rank):
    model = AutoModelForSequenceClassification.from_pretrained("gpt2", num_labels=1)
    args = TrainingArguments(output_dir=output_dir, local_rank=local_rank)
    trainer = Trainer(model=model, args=args)
    trainer.train()
    if trainer.is_world_process_zero():
        model.save_pretrained(output_dir + "/last")
