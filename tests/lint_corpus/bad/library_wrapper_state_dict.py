# The state_dict() of what a library hands back around the model: the DeepSpeed engine is an
# nn.Module holding the model as engine.module, and Accelerate's prepare() returns the model
# in DistributedDataParallel on several GPUs; both save every key under "module.".
import deepspeed
import torch
from accelerate import Accelerator


def run_deepspeed(args, net, data):
    engine, optim, loader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=net.parameters(), training_data=data
    )
    for batch in loader:
        engine.backward(engine(batch))
        engine.step()
    if torch.distributed.get_rank() == 0:
        torch.save(engine.state_dict(), "final.pt")  # expect: GT006


def save_weights(network, path):
    torch.save({"weights": network.state_dict()}, path)


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
        torch.save(classifier.state_dict(), "classifier.pt")  # expect: GT006
        torch.save(
            opt.state_dict(), "optimizer.pt"
        )  # a prepared optimizer: the inner state


def run_accelerate_one(model, loader):
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare_model(model)
    for batch in loader:
        acc.backward(model(batch).loss)
    if acc.is_main_process:
        save_weights(model, "w.pt")  # expect: GT006
