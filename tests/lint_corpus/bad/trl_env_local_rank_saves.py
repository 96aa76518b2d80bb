# The same pattern through TRL: the node-local rank read from the environment, a `<= 0`
# guard (LOCAL_RANK may be -1 when unset), and the adapter and tokenizer written under it.
import os

from trl import SFTConfig, SFTTrainer

LOCAL_RANK = int(os.getenv("LOCAL_RANK", "-1"))


def main(model, tokenizer, data):
    config = SFTConfig(output_dir="ckpt", bf16=True)
    trainer = SFTTrainer(model=model, args=config, train_dataset=data)
    trainer.train()
    if LOCAL_RANK <= 0:
        trainer.model.save_pretrained("ckpt/final")  # expect: GT017
        tokenizer.save_pretrained("ckpt/final")  # expect: GT017


if __name__ == "__main__":
    main(None, None, None)
