# An Accelerator built with an FSDP plugin shards the model it prepares: its forward,
# generate() and the state_dict() behind save_pretrained() all-gather the shards from every
# process. Run on the main process only, they wait for ranks that never come (issue 33, set
# 10's validation of an Accelerate-FSDP model under `if self.is_main:`).
import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin


class Trainer:
    def __init__(self, model, optimizer, loader):
        plugin = FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD")
        self.accelerator = Accelerator(fsdp_plugin=plugin)
        self.is_main = self.accelerator.is_main_process
        self.model, self.optimizer, self.loader = self.accelerator.prepare(
            model, optimizer, loader
        )

    def validate(self, batches):
        losses = []
        with torch.no_grad():
            for i, batch in enumerate(self.loader):
                if i >= batches:
                    break
                losses.append(self.model(**batch).loss.item())
        return sum(losses) / max(1, len(losses))

    def fit(self, steps):
        for step, batch in enumerate(self.loader):
            with self.accelerator.accumulate(self.model):
                loss = self.model(**batch).loss
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()
            if step % 100 == 0 and self.is_main:
                print(step, self.validate(4))  # expect: GT009
            if step >= steps:
                break


def sample_and_export(model, optimizer, loader, tokenizer):
    accelerator = Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if accelerator.is_main_process:
        out = model.generate(**tokenizer("Hello", return_tensors="pt"))  # expect: GT009
        print(tokenizer.decode(out[0]))
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        unwrapped.save_pretrained("out", save_function=accelerator.save)  # expect: GT009
    # the safe form: the full state dict gathered on every process, written by one
    state = accelerator.get_state_dict(model)
    unwrapped.save_pretrained("out", is_main_process=accelerator.is_main_process, state_dict=state)
