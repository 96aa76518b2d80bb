# The same libraries, saved the way their guides say: the engine's module (or its own
# checkpoint), Accelerate's unwrap_model, and a model rebound to its unwrapped self.
import deepspeed
import torch
from accelerate import Accelerator


def run_deepspeed(args, net, data):
    engine, _, loader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=net.parameters(), training_data=data
    )
    for batch in loader:
        engine.backward(engine(batch))
        engine.step()
    engine.save_checkpoint("ckpt")
    if torch.distributed.get_rank() == 0:
        torch.save(engine.module.state_dict(), "final.pt")


def run_accelerate(build_model, build_optimizer, train_loader, epochs):
    accelerator = Accelerator()
    classifier = build_model()
    opt = build_optimizer(classifier.parameters())
    classifier, opt, train_loader = accelerator.prepare(classifier, opt, train_loader)
    for _ in range(epochs):
        classifier.train()
        for x, y in train_loader:
            accelerator.backward(torch.nn.functional.cross_entropy(classifier(x), y))
            opt.step()
            opt.zero_grad()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(classifier).state_dict(), "classifier.pt")
        torch.save(opt.state_dict(), "optimizer.pt")
    classifier = accelerator.unwrap_model(classifier)
    if accelerator.is_main_process:
        torch.save(classifier.state_dict(), "again.pt")
